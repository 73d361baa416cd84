"""Hypothesis strategies shared by the hostile-input tests: JSON of any shape, hostile strings."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["PRINTABLE", "header_text", "hostile_text", "json_values", "redfish_keys"]

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F)) + "äöü°§"
header_text = st.text(alphabet=PRINTABLE, max_size=60)
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "\x00",
            "line one\r\nX-Injected: yes",
            "\u202egnp.exe",
            "\ud800",
            "%s%s%n",
            "${jndi:ldap://x/a}",
            "../../../../etc/passwd",
            "A" * 20000,
        ]
    ),
)
redfish_keys = st.sampled_from(
    ["@odata.id", "@odata.type", "Id", "Members", "Members@odata.nextLink", "Links", "TaskState", "error"]
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(redfish_keys | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=15,
)
