"""What every floor of the agent stands on: its configuration (config) and documentation links (links), logging
(logs), clocks passed in (clock), regular expressions matched in linear time (regex) and the devices' peak
FLOP rates (peaks). The hook uses none of them (it imports the standard library and shared/ only).

No imports here: each module has its own floor (pyproject.toml's layers), and importing one costs no other.
"""
