"""``coevo runs serve RUN_DIR``: a local, read-only web dashboard over a run's trajectory store.

Modules: :mod:`coevo.dashboard.reader` (opening checks and the rows each panel shows; no web code),
:mod:`coevo.dashboard.figures` (plotly figures of those rows), :mod:`coevo.dashboard.app` (the Dash app:
pages, live refresh) and :mod:`coevo.dashboard.cli` (the ``runs serve`` sub-command).

Dash (Plotly's Python web framework on Flask) was chosen because it ships every asset the page needs
inside its Python packages (React, its components, plotly.js) and serves them from the local server by
default (``serve_locally=True``), so the dashboard works on machines without internet; its callbacks give
live refresh and interactive filters without hand-written JavaScript, and its plots are plotly's. The
web parts need the ``dash`` extra (``pip install 'coevo[dash]'``); :mod:`coevo.dashboard.reader` needs
only coevo's core dependencies.
"""
