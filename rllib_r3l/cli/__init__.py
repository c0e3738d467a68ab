"""The command line: ``rllib-r3l`` (``commands``), the main job (``main``), and what they use:
experiment files and validation, launching with Tune, the console, evaluation, export, reports.

Lower layers never import from here.
"""
