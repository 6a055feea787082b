"""The device layer: pjrt tensors and their storage cells (``tensor``), torch
arguments as a program's arrays (``binding``), ``torch.pjrt``
(``module``), RNG state and the current device (``random``), streams and events
(``streams``), serialization (``serialization``) and ``torch.accelerator`` on pjrt
(``accelerator``). Above ``runtime`` and ``modes``, below ``ops``.

Importing this package imports none of them: ``_registration.register()`` installs them.
"""
