"""Metric definitions (the catalog, its generated reference), sweep families, exposition and the text format's
reader, definitions of foreign metrics (prometheus_client files, OTLP), histogram quantiles and human units."""
