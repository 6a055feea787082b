"""Diagnostics: what the device did (``metrics``), strict mode (``strict``, a listener of
``runtime.events``), the checks of ``torch-pjrt doctor`` (``doctor``), and
``report(script)``, the HTML report of a run (``html_report``; imported on first use)."""


def __getattr__(name: str):
    if name == "report":  # (torch_pjrt.diagnostics.report(path), as torch-pjrt report)
        from torch_pjrt.diagnostics.html_report import report

        return report
    raise AttributeError(f"module 'torch_pjrt.diagnostics' has no attribute '{name}'")
