"""perfscope.dashboard: figures (plotly), the standalone HTML report and the Dash app.

Importing this package does not import dash; only ``app`` and its modules do.
"""
