"""Kafka's ``ssl.principal.mapping.rules`` (``tls.principal_mapping_rules``): the parser and the rules.

Owns nothing; pure functions at the configuration's layer, so that ``appliance.config`` can reject
bad rules when it loads without reaching up into ``appliance.security`` (which applies them to a
certificate's subject: ``appliance.security.principal``). Runs in every process that checks a
configuration, and in the frontends.

``RULE:pattern/replacement/[LU]``: the first rule whose pattern matches the whole name wins,
``$1`` in the replacement is the first group (java.util.regex replacement syntax), L/U lower- or
upper-case the result; ``DEFAULT`` keeps the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MappingRule", "MappingRuleError", "parse_mapping_rules"]


class MappingRuleError(ValueError):
    pass


@dataclass(frozen=True)
class MappingRule:
    pattern: re.Pattern | None       # None: DEFAULT
    replacement: str = ""
    case: str = ""                   # "", "L" or "U"

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        out = self.pattern.sub(self.replacement, name)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = re.compile(r"^RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)$")


def parse_mapping_rules(rules: list[str]) -> list[MappingRule]:
    out = []
    for text in rules:
        text = text.strip()
        if text == "DEFAULT":
            out.append(MappingRule(None))
            continue
        m = _RULE.match(text)
        if m is None:
            raise MappingRuleError(f"{text!r}: expected DEFAULT or RULE:pattern/replacement/[LU]")
        try:
            pattern = re.compile(m.group(1))
        except re.error as e:
            raise MappingRuleError(f"{text!r}: bad pattern: {e}") from None
        out.append(MappingRule(pattern, _java_replacement(m.group(2)), m.group(3)))
    return out


def _java_replacement(text: str) -> str:
    """A java.util.regex replacement (``$1``, ``\\$``) as a Python ``re.sub`` template."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i + 1].replace("\\", "\\\\"))
            i += 2
        elif c == "$" and i + 1 < len(text) and text[i + 1].isdigit():
            j = i + 1
            while j < len(text) and text[j].isdigit():
                j += 1
            out.append(f"\\g<{text[i + 1:j]}>")
            i = j
        else:
            out.append("\\\\" if c == "\\" else c)
            i += 1
    return "".join(out)
