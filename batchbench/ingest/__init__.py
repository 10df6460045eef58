"""Workloads in: request logs and public traces turned into schema v2 manifests.

The stages are shared by every source: a source parses its rows into compact records
(``rows``), then the export window (``window``), session reconstruction (``sessions``),
plan construction (``plans``), sampling (``sampling``) and validation plus the atomic write
(``write``) run the same way. ``export_plans`` is the request-log exporter of COMPAT §7.
"""
