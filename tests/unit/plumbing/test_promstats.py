from __future__ import annotations

import pytest

from plumbing.promstats import outcome_word


@pytest.mark.parametrize(
    ("outcome", "word"),
    [
        ("404", "not_found"),
        ("503", "service_unavailable"),
        ("500", "internal_server_error"),
        ("412", "precondition_failed"),
        ("599", "http_error"),
        ("transport", "transport"),
        ("DeviceBusy", "DeviceBusy"),
    ],
)
def test_outcomes_are_words(outcome: str, word: str) -> None:
    assert outcome_word(outcome) == word
