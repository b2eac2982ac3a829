"""`LiveWidget`: the anywidget model the notebook front end draws (``static/widget.js``).

The ESM sent to the browser is ``graphs.js`` (with ``theme.json`` inlined in place of its
import) followed by ``widget.js`` without its import line. anywidget loads the module from
a string, where no relative import can resolve; assembling it at import time keeps the
files real, separately testable ``.js`` and ``.json`` files and needs no bundler. They
define only distinct top-level names, so the result is one valid module.

The settings the front end needs (the view's bounds, the chart windows) travel as traits,
read from Dask config (`nbcluster.config`) when the widget is made.
"""

from __future__ import annotations

import re

import anywidget
import traitlets

from nbcluster import config
from nbcluster.widgets._theme import STATIC, inline_theme


def build_esm() -> str:
    """graphs.js + widget.js as one ES module.

    Returns
    -------
    str
        The widget's ``_esm``.

    Raises
    ------
    RuntimeError
        When widget.js does not import graphs.js on exactly one line.
    """
    graphs = inline_theme((STATIC / "graphs.js").read_text(encoding="utf-8"))
    widget = (STATIC / "widget.js").read_text(encoding="utf-8")
    widget, n = re.subn(r'^import \{[^}]*\} from "\./graphs\.js";\n', "", widget, flags=re.M)
    if n != 1:
        raise RuntimeError("widget.js must import graphs.js on one line")
    return f"{graphs}\n// ---- widget.js ----\n{widget}"


class LiveWidget(anywidget.AnyWidget):
    """Progress, task stream and worker charts of one run (or of a cluster, for status).

    Filled by `nbcluster.widgets.Live`; on its own it is an empty frame.
    """

    _esm = build_esm()

    #: {done, running, failed, total, rate?, eta?, elapsed, state, label?}
    progress = traitlets.Dict().tag(sync=True)
    #: {params: [...], rows: [{params, value, status}], total, ranked}: best rows first when
    #: ranked ("max"/"min", the run's objective), else in item order
    grid = traitlets.Dict().tag(sync=True)
    #: a trial run's curves: {metric, mode, series: [{label, points: [[step, value]], state, best}]}
    curves = traitlets.Dict().tag(sync=True)
    #: a trial run's stop buttons: {running: [{item, label}], more}; {} for other runs
    #: (`_controls.py`: the messages the buttons send, and when they show)
    controls = traitlets.Dict().tag(sync=True)
    #: the latest poll's new records: a metrics snapshot plus "seq" (and "reset" for a
    #: fresh start); the front end folds these into its own bounded view
    delta = traitlets.Dict().tag(sync=True)
    #: seconds of task stream shown; None shows the whole run
    window = traitlets.Float(None, allow_none=True).tag(sync=True)
    #: seconds of resource history shown
    resource_window = traitlets.Float().tag(sync=True)
    #: the front end's view bounds: {maxTasks, maxSamples}
    limits = traitlets.Dict().tag(sync=True)

    @traitlets.default("resource_window")
    def _resource_window(self) -> float:
        return config.seconds("widget.resource-window")

    @traitlets.default("limits")
    def _limits(self) -> dict[str, int]:
        return config.view_limits()
