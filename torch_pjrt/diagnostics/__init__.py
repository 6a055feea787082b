"""Diagnostics: what the device did (``metrics``), strict mode (``strict``, a listener of
``runtime.events``), and the checks of ``torch-pjrt doctor`` (``doctor``)."""
