"""Shared pieces of Outrider's dashboards: template variables, query and panel factories, thresholds, runbook links.

Built with grafana-foundation-sdk (the Grafana 11.6 build). Every panel has a unit, a description and thresholds;
queries use the template variables, so one dashboard serves every job, pod, rank and GPU. Links to runbooks and to
the metrics reference start with the one documentation URL (outrider.ground.links), chosen when the dashboards are
rendered.
"""

from __future__ import annotations

import itertools
from typing import Any

from grafana_foundation_sdk.builders import heatmap as heatmap_panel
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions, VizTooltipOptions
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    BigValueJustifyMode,
    BigValueTextMode,
    LegendDisplayMode,
    LegendPlacement,
    PercentChangeColorMode,
    SortOrder,
    TooltipDisplayMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)

from outrider.ground import links

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace=~"$namespace", job=~"$job", instance=~"$instance"'
# The Kubernetes workload that owns a GPU (kubelet PodResources; the agent's default owner label names). A GPU no pod
# owns has no such label, and the variables' All (.*) matches the empty value: unowned GPUs stay in view.
OWNER = 'exported_namespace=~"$workload_namespace", exported_pod=~"$workload_pod"'
_docs: str | None = None  # the documentation base URL of the dashboards being rendered (None: links.docs_url())


def set_docs_url(url: str | None) -> None:
    global _docs
    _docs = url


def variable(name: str, label: str, query: str, multi: bool = True) -> QueryVariable:
    return (QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC).multi(multi)
            .include_all(True).all_value(".*"))


def dashboard(uid: str, title: str, description: str, tags: list[str], variables: list[str]) -> Dashboard:
    """A dashboard with the datasource variable and the identity variables asked for, in a fixed order."""
    d = (Dashboard(title).uid(uid).description(description).tags(["outrider", *tags]).refresh("30s")
         .time("now-1h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .link(DashboardLink("Outrider dashboards").type(DashboardLinkType.DASHBOARDS).tags(["outrider"])
               .as_dropdown(True).include_vars(True).keep_time(True))
         .link(DashboardLink("Metrics reference").type(DashboardLinkType.LINK)
               .url(f"{links.docs_url(_docs)}docs/metrics.md").target_blank(True)))
    base = "outrider_agent_info"
    by_node = "node" in variables  # the agents of the chosen Kubernetes nodes (outrider_k8s_info, Downward API)
    owned = "workload_pod" in variables
    known = {
        "namespace": ("Namespace", f"label_values({base}, namespace)"),
        "job": ("Job", f'label_values({base}{{namespace=~"$namespace"}}, job)'),
        "node": ("Node", 'label_values(outrider_k8s_info{namespace=~"$namespace", job=~"$job"}, node)'),
        "instance": ("Pod / instance",
                     'label_values(outrider_k8s_info{namespace=~"$namespace", job=~"$job", node=~"$node"}, instance)'
                     if by_node else f'label_values({base}{{namespace=~"$namespace", job=~"$job"}}, instance)'),
        "workload_namespace": ("Workload namespace", f"label_values(outrider_gpu_up{{{SEL}}}, exported_namespace)"),
        "workload_pod": ("Workload pod", f'label_values(outrider_gpu_up{{{SEL}, '
                         f'exported_namespace=~"$workload_namespace"}}, exported_pod)'),
        "rank": ("Rank", f"label_values(outrider_train_steps_total{{{SEL}}}, rank)"),
        "gpu": ("GPU", f"label_values(outrider_gpu_up{{{SEL}, {OWNER}}}, gpu)" if owned
                else f"label_values(outrider_gpu_up{{{SEL}}}, gpu)"),
        "route": ("Route", f"label_values(outrider_requests_total{{{SEL}}}, route)"),
    }
    for name in variables:
        label, query = known[name]
        d = d.with_variable(variable(name, label, query))
    return d


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Dataquery:
    q = Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref)
    if instant:
        q = q.instant()
    if table:
        from grafana_foundation_sdk.models.prometheus import PromQueryFormat

        q = q.format(PromQueryFormat.TABLE)
    return q


def percentiles(bucket_selector: str, *quantiles: float, by: str = "le", legend: str = "") -> list[Dataquery]:
    """histogram_quantile queries over a histogram's buckets, one per quantile, legends "p50", "p99"..."""
    return [query(f"histogram_quantile({q}, sum by ({by}) (rate({bucket_selector}[$__rate_interval])))",
                  f"p{round(q * 100)}{legend}") for q in quantiles]


def thresholds(*steps: tuple[float | None, str]) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(v, c) for v, c in steps])


GREEN = (None, "green")


def runbook(anchor_file: str, anchor: str, title: str) -> DashboardLink:
    return (DashboardLink(f"Runbook: {title}").type(DashboardLinkType.LINK)
            .url(links.runbook_url(anchor_file, anchor, _docs)).target_blank(True))


_ids = itertools.count(1)


def _common(p: Any, title: str, description: str, unit: str, queries: list[Dataquery], width: int,
            height: int, th: ThresholdsConfig | None, links: list[DashboardLink] | None) -> Any:
    p = p.id(next(_ids)).title(title).description(description).unit(unit).datasource(DATASOURCE).span(width)
    p = p.height(height)
    for i, q in enumerate(queries):
        p = p.with_target(q.ref_id(chr(ord("A") + i)))
    p = p.thresholds(th or thresholds(GREEN))
    if links:
        p = p.links(links)
    return p


def ts(title: str, description: str, unit: str, *queries: Dataquery, width: int = 12, height: int = 8,
       th: ThresholdsConfig | None = None, links: list[DashboardLink] | None = None, min_val: float | None = None,
       max_val: float | None = None) -> Any:
    p = _common(timeseries.Panel(), title, description, unit, list(queries), width, height, th, links)
    p = p.fill_opacity(10).line_width(1).legend(
        VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM).show_legend(True)
        .calcs([])).tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return p


def stat(title: str, description: str, unit: str, q: Dataquery, width: int = 6, height: int = 4,
         th: ThresholdsConfig | None = None, links: list[DashboardLink] | None = None) -> Any:
    p = _common(stat_panel.Panel(), title, description, unit, [q], width, height, th, links)
    text_mode = BigValueTextMode.NAME if "{{" in (q.build().legend_format or "") and "__auto" not in (
        q.build().legend_format or "") else BigValueTextMode.AUTO
    return (p.graph_mode(BigValueGraphMode.AREA).color_mode(BigValueColorMode.VALUE)
            .justify_mode(BigValueJustifyMode.AUTO).text_mode(text_mode).wide_layout(True)
            .show_percent_change(False).percent_change_color_mode(PercentChangeColorMode.STANDARD)
            .orientation(VizOrientation.AUTO).reduce_options(ReduceDataOptions().calcs(["lastNotNull"])))


def table(title: str, description: str, unit: str, *queries: Dataquery, width: int = 24, height: int = 8,
          th: ThresholdsConfig | None = None, links: list[DashboardLink] | None = None) -> Any:
    return _common(table_panel.Panel(), title, description, unit, list(queries), width, height, th, links)


def joined_table(title: str, description: str, columns: list[tuple[str, str, Dataquery]], width: int = 24,
                 height: int = 8, th: ThresholdsConfig | None = None) -> Any:
    """One row per entity from several instant queries (nvitop's process table): each query gives one column, its
    value titled and with its own unit; Grafana's merge transformation joins the rows on the labels the queries
    share (instance and pid, say), so every query keeps exactly those labels plus its own descriptive ones."""
    queries = [q.format(_table_format()).instant() for _, _, q in columns]
    p = _common(table_panel.Panel(), title, description, "short", queries, width, height, th, None)
    p = p.with_transformation(DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True}, "renameByName": {}}))
    for i, (name, unit, _) in enumerate(columns):
        p = p.override_by_name(f"Value #{chr(ord('A') + i)}", [DynamicConfigValue("unit", unit),
                                                                DynamicConfigValue("displayName", name)])
    return p


def _table_format() -> Any:
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    return PromQueryFormat.TABLE


def heatmap(title: str, description: str, unit: str, q: Dataquery, width: int = 12,
            height: int = 8) -> Any:
    from grafana_foundation_sdk.builders.heatmap import YAxisConfig
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    q = q.format(PromQueryFormat.HEATMAP)
    p = _common(heatmap_panel.Panel(), title, description, unit, [q], width, height, None, None)
    return p.calculate(False).y_axis(YAxisConfig().unit(unit))


def reset_ids() -> None:
    global _ids
    _ids = itertools.count(1)
