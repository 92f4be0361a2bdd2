"""``mask-json``: mask fields of JSON messages before the broker stores them.

The example filter of docs/filters.md, a distribution of its own
(tests/example_filter/): ``--filter 'mask-json:{"topics": [...],
"settings": {"fields": ["ssn"]}}'`` replaces the value of every field named
``ssn`` (in the JSON object a producer sends, at any depth) with ``***`` and
marks the message with a property, ``masked-by: sluice``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluice.filters import PASS, Filter, Message, Replace, Verdict

__all__ = ["MaskJsonFields", "MaskSettings"]


@dataclass(frozen=True)
class MaskSettings:
    # The JSON field names to mask, in objects at any depth.
    fields: list[str]
    # What a masked field's value becomes.
    mask: str = "***"
    # The property a changed message gets (kept with the ones it had).
    property: str = "masked-by"
    property_value: str = "sluice"

    # A check of its own, after Sluice has checked the types: the
    # ValueError is the one line the user sees.
    def __post_init__(self) -> None:
        if not self.fields:
            raise ValueError("setting 'fields' must name at least one field")


class MaskJsonFields(Filter[MaskSettings]):
    """Produced JSON objects with the listed fields' values masked."""

    Settings = MaskSettings

    def __init__(self, settings: MaskSettings) -> None:
        super().__init__(settings)
        self._fields = frozenset(settings.fields)

    def on_produce(self, message: Message) -> Verdict:
        if message.encrypted or message.null:  # ciphertext, or no value at all
            return PASS
        try:
            document = json.loads(message.payload)
        except ValueError:
            # Not JSON (or not UTF-8): passed on as it is. This filter masks,
            # it does not validate; refusing what does not match the topic's
            # schema is the schema filter's work.
            return PASS
        if not isinstance(document, dict) or not self._mask(document):
            return PASS
        settings = self.settings
        # Written anew, compactly: the rest of the document keeps its values
        # and key order, not its spacing. A number Python reads as infinite
        # (1e400) cannot be written back as JSON: the ValueError makes Sluice
        # refuse the message (on-error "closed") rather than store it unmasked.
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        payload = text.encode()
        properties = {**message.properties, settings.property: settings.property_value}
        return Replace(payload=payload, properties=properties)

    def _mask(self, document: dict[str, Any]) -> bool:
        """Mask ``document`` in place; whether anything changed. A walk with
        a stack of its own, so no document json.loads could read is too deep."""
        mask, changed = self.settings.mask, False
        stack: list[Any] = [document]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                for key, item in value.items():
                    if key in self._fields:
                        changed |= item != mask
                        value[key] = mask
                    else:
                        stack.append(item)
            elif isinstance(value, list):
                stack.extend(value)
        return changed

    # No on_deliver: Sluice then leaves deliveries packed (a hook of the
    # base class only passes, and costs unpacking every message).
