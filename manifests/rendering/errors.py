"""The one error the rendering steps raise; render.py prints it as one line and exits 1."""


class RenderError(Exception):
    """A failed step, printed as one line without a traceback."""
