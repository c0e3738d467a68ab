"""Reflection (paper §4): the reflector's prompt and guidance (``reflect``), the report it writes and
its lenient parser (``report``, ``lenient_json``), what it reads (``context``), and diagnostics
against an environment's oracle (``oracle``, ``pivot_metrics``)."""
