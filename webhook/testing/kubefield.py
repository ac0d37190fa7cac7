"""Field errors and the syntax rules for names, labels and annotations, worded as kube-apiserver words them.

A refused write is a 422 whose message lists `field.Error`s (apimachinery's util/validation/field):
`spec.nodeSelector: Invalid value: {"a":"b"}: only additions ...`. The simulator builds the same list,
with the same field paths, error types and details, so a client that logs or matches them meets what it
would meet in a cluster. The name rules are apimachinery's util/validation (IsQualifiedName,
IsValidLabelValue, IsDNS1123Subdomain), checked with linear regular expressions on bounded input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# field.ErrorType: the cause type a Status carries, and the words its message uses.
REQUIRED, INVALID, FORBIDDEN, NOT_SUPPORTED, DUPLICATE, TOO_LONG = (
    "FieldValueRequired",
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueNotSupported",
    "FieldValueDuplicate",
    "FieldValueTooLong",
)
_WORDS = {
    REQUIRED: "Required value",
    INVALID: "Invalid value",
    FORBIDDEN: "Forbidden",
    NOT_SUPPORTED: "Unsupported value",
    DUPLICATE: "Duplicate value",
    TOO_LONG: "Too long",
}
_NO_VALUE = (REQUIRED, FORBIDDEN, TOO_LONG)  # the types whose message leaves the bad value out


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field.Error: the type, the field path (`spec.tolerations[2].key`), the bad value, the detail."""

    type: str
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        """ErrorBody(): the message without the field path."""
        text = _WORDS[self.type]
        if self.type not in _NO_VALUE:
            text += ": " + _render(self.value)
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def required(field: str, detail: str = "") -> FieldError:
    return FieldError(REQUIRED, field, None, detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(INVALID, field, value, detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError(FORBIDDEN, field, None, detail)


def not_supported(field: str, value: Any, supported: Sequence[str]) -> FieldError:
    return FieldError(NOT_SUPPORTED, field, value, "supported values: " + ", ".join(f'"{s}"' for s in supported))


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError(DUPLICATE, field, value)


def too_long(field: str, limit: int) -> FieldError:
    return FieldError(TOO_LONG, field, None, f"may not be more than {limit} bytes")


def aggregate(errors: Sequence[FieldError]) -> str:
    """utilerrors.Aggregate's message: one error as it is, several as `[a, b]`."""
    if len(errors) == 1:
        return str(errors[0])
    return "[" + ", ".join(str(e) for e in errors) + "]"


def _render(value: Any) -> str:
    # Go prints numbers and booleans with %v, strings with %q and anything else as JSON.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return orjson.dumps(value).decode()


# -- names ---------------------------------------------------------------------------------------

_QUALIFIED_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED = re.compile(_QUALIFIED_FMT)
_LABEL_VALUE_FMT = f"({_QUALIFIED_FMT})?"
_LABEL_VALUE = re.compile(_LABEL_VALUE_FMT)
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_QUALIFIED_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
ANNOTATIONS_MAX_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _full(pattern: re.Pattern[str], text: str) -> bool:
    return pattern.fullmatch(text) is not None


def dns1123_subdomain_problems(value: str) -> list[str]:
    """IsDNS1123Subdomain: the messages for a value that is not one (empty list: it is)."""
    problems = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        problems.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if len(value) > DNS1123_SUBDOMAIN_MAX * 4 or not _full(_DNS1123_SUBDOMAIN, value):
        problems.append(_regex_error(_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return problems


def qualified_name_problems(value: str) -> list[str]:
    """IsQualifiedName: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 characters."""
    parts = value.split("/")
    problems: list[str] = []
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems += ["prefix part " + p for p in dns1123_subdomain_problems(prefix)]
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_MSG, _QUALIFIED_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        problems.append(f"name part must be no more than {QUALIFIED_NAME_MAX} characters")
    if len(name) > QUALIFIED_NAME_MAX * 4 or not _full(_QUALIFIED, name):
        problems.append("name part " + _regex_error(_QUALIFIED_MSG, _QUALIFIED_FMT, "MyName", "my.name", "123-abc"))
    return problems


def label_value_problems(value: str) -> list[str]:
    """IsValidLabelValue: empty, or at most 63 characters of the qualified-name alphabet."""
    problems = []
    if len(value) > LABEL_VALUE_MAX:
        problems.append(f"must be no more than {LABEL_VALUE_MAX} characters")
    if len(value) > LABEL_VALUE_MAX * 4 or not _full(_LABEL_VALUE, value):
        problems.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return problems


def validate_labels(labels: Any, path: str) -> list[FieldError]:
    """ValidateLabels: a map of qualified-name keys to label values (also a nodeSelector's rule)."""
    if labels is None:
        return []
    if not is_string_map(labels):
        return [invalid(path, labels, "must be a map of strings to strings")]
    errors = [invalid(path, k, msg) for k in labels for msg in qualified_name_problems(k)]
    return errors + [invalid(path, v, msg) for v in labels.values() for msg in label_value_problems(v)]


def validate_annotations(annotations: Any, path: str) -> list[FieldError]:
    """ValidateAnnotations: qualified-name keys (checked lowercased) and at most 256 KiB in all."""
    if annotations is None:
        return []
    if not is_string_map(annotations):
        return [invalid(path, annotations, "must be a map of strings to strings")]
    errors = [invalid(path, k, msg) for k in annotations for msg in qualified_name_problems(k.lower())]
    if sum(len(k) + len(v) for k, v in annotations.items()) > ANNOTATIONS_MAX_BYTES:
        errors.append(too_long(path, ANNOTATIONS_MAX_BYTES))
    return errors


def is_string_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def objects_in(value: Any) -> Iterable[tuple[int, Mapping[str, Any]]]:
    """(index, item) of the object items of a list, for rules that read lists clients sent."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, Mapping):
                yield i, item
