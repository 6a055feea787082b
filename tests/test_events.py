"""runtime.events: the counters behind torch_pjrt.metrics, and the listeners of events."""

from __future__ import annotations

import pytest
import torch

import torch_pjrt
from torch_pjrt.diagnostics import strict
from torch_pjrt.runtime import events


def test_metrics_is_the_public_view_of_events():
    for name in torch_pjrt.metrics.__all__:
        assert getattr(torch_pjrt.metrics, name) is getattr(events, name)


def test_listeners_hear_fallbacks_host_syncs_and_compilations():
    heard = []

    def listener(event, what):
        heard.append((event, what))

    events.listen(listener)
    events.listen(listener)  # once, however often it is passed
    try:
        events.fallback("aten::pjrt_test_op")
        events.host_sync()
        events.compilation("eager", None, 0.0, "pjrt_test: first call")
    finally:
        events.unlisten(listener)
    events.unlisten(listener)  # (not listening: nothing happens)
    events.host_sync()
    assert [e for e, _ in heard] == ["fallback", "host sync", "compilation"]
    assert heard[0][1] == "aten::pjrt_test_op"
    assert heard[1][1].startswith(__file__)  # the user's line
    assert heard[2][1] == "pjrt_test: first call"


def test_a_listeners_error_is_marked_and_not_counted():
    def refuse(event, what):
        raise ValueError(f"no {event}")

    before = torch_pjrt.metrics.as_dict()["fallbacks"].get("aten::pjrt_refused", 0)
    events.listen(refuse)
    try:
        with pytest.raises(ValueError, match="no fallback") as info:
            events.fallback("aten::pjrt_refused")
    finally:
        events.unlisten(refuse)
    assert info.value.pjrt_event is True
    assert torch_pjrt.metrics.as_dict()["fallbacks"].get("aten::pjrt_refused", 0) == before


def test_strict_mode_is_a_listener():
    assert strict._watch in events._listeners
    with torch_pjrt.strict(), pytest.raises(torch_pjrt.StrictModeError) as info:
        events.fallback("aten::pjrt_strict_test")
    assert info.value.pjrt_event is True
    events.fallback("aten::pjrt_strict_test")  # strict mode off: counted, no error


def test_strict_mode_error_reaches_the_user_unwrapped_from_an_op():
    """A compilation inside a checked step raises from within an op's program call: the
    registry passes the marked error on as it is (not as a torch_pjrt bug report), on the
    eager fast path too (which hands other errors to the general path)."""
    x = torch.ones(13, 1, 7, 3, device="pjrt")  # a shape no other test adds
    with torch_pjrt.mode("eager"), torch_pjrt.strict():
        for _ in range(torch_pjrt.settings.strict_warmup + 1):
            with torch_pjrt.step():
                pass
        with torch_pjrt.step(), pytest.raises(torch_pjrt.StrictModeError, match="compilation"):
            x + x
