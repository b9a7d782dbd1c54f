"""Kubernetes' DRA CEL environment beyond the device libraries: cel-go's strings extension (version 2, as Kubernetes'
base environment enables it), semver equality as Kubernetes evaluates it, and the actual-cost limit.

Expected values are the examples cel-go documents for each function (ext/strings.go) and Go's own semantics where
the examples stop (runes, not bytes; Go's whitespace; negative limits)."""

from __future__ import annotations

import pytest

from scheduler.cel import SelectorCompileError, SelectorRuntimeError, compile_selector

DEVICE = {
    "name": "gpu-0",
    "driver": "gpu.nvidia.com",
    "attributes": {
        "productName": {"string": "NVIDIA H200 NVL"},
        "driverVersion": {"version": "550.54.15"},
    },
    "capacity": {"memory": {"value": "141Gi"}},
}


def holds(expression: str, device: dict = DEVICE) -> bool:
    return compile_selector(expression).matches(device)


def runtime_reason(expression: str, device: dict = DEVICE) -> str:
    with pytest.raises(SelectorRuntimeError) as raised:
        holds(expression, device)
    return raised.value.reason


@pytest.mark.parametrize(
    "expression",
    [
        # cel-go's documented examples, each compared with its documented result
        "'hello'.charAt(4) == 'o'",
        "'hello'.charAt(5) == ''",
        "'hello mellow'.indexOf('') == 0",
        "'hello mellow'.indexOf('ello') == 1",
        "'hello mellow'.indexOf('jello') == -1",
        "'hello mellow'.indexOf('', 2) == 2",
        "'hello mellow'.indexOf('ello', 2) == 7",
        "['hello', 'mellow'].join() == 'hellomellow'",
        "['hello', 'mellow'].join(' ') == 'hello mellow'",
        "[].join() == ''",
        "[].join('/') == ''",
        "'hello mellow'.lastIndexOf('') == 12",
        "'hello mellow'.lastIndexOf('ello') == 7",
        "'hello mellow'.lastIndexOf('jello') == -1",
        "'hello mellow'.lastIndexOf('ello', 6) == 1",
        "'TacoCat'.lowerAscii() == 'tacocat'",
        "'TacoCÆt Xii'.lowerAscii() == 'tacocÆt xii'",
        "'hello hello'.replace('he', 'we') == 'wello wello'",
        "'hello hello'.replace('he', 'we', -1) == 'wello wello'",
        "'hello hello'.replace('he', 'we', 1) == 'wello hello'",
        "'hello hello'.replace('he', 'we', 0) == 'hello hello'",
        "'hello hello hello'.split(' ') == ['hello', 'hello', 'hello']",
        "'hello hello hello'.split(' ', 0) == []",
        "'hello hello hello'.split(' ', 1) == ['hello hello hello']",
        "'hello hello hello'.split(' ', 2) == ['hello', 'hello hello']",
        "'hello hello hello'.split(' ', -1) == ['hello', 'hello', 'hello']",
        "'tacocat'.substring(4) == 'cat'",
        "'tacocat'.substring(0, 4) == 'taco'",
        "'  \\ttrim\\n    '.trim() == 'trim'",
        "'TacoCat'.upperAscii() == 'TACOCAT'",
        "'TacoCÆt Xii'.upperAscii() == 'TACOCÆT XII'",
        'strings.quote(\'single-quote with "double quote"\') == \'"single-quote with \\\\"double quote\\\\""\'',
        'strings.quote("two escape sequences \\a\\n") == \'"two escape sequences \\\\a\\\\n"\'',
        "'this is a string: %s\\nand an integer: %d'.format(['str', 42]) == 'this is a string: str\\nand an integer: 42'",
        "'a double substituted with %%s: %s'.format([64.2]) == 'a double substituted with %s: 64.2'",
        "'%f'.format([3.14]) == '3.140000'",
        "'5 in binary: %b'.format([5]) == '5 in binary: 101'",
        "'26 in hex: %x'.format([26]) == '26 in hex: 1a'",
        "'26 in hex (uppercase): %X'.format([26]) == '26 in hex (uppercase): 1A'",
        "'30 in octal: %o'.format([30]) == '30 in octal: 36'",
        "'true bool: %s - false bool: %s\\nbinary bool: %b'.format([true, false, true]) == "
        "'true bool: true - false bool: false\\nbinary bool: 1'",
        # Go's semantics: runes, not bytes; Go's whitespace; exploding on an empty separator
        "'héllo'.charAt(1) == 'é' && 'héllo'.indexOf('l') == 2 && 'héllo'.substring(1, 3) == 'él'",
        "'abc'.split('') == ['a', 'b', 'c'] && 'abc'.split('', 2) == ['a', 'bc']",
        "'\\u00a0x\\u2003'.trim() == 'x' && '\\u001fx'.trim() == '\\u001fx'",
        "'%.2f and %.3e'.format([2.5, 1234.5]) == '2.50 and 1.234e+03'",
        "'%s'.format([1234567.0]) == '1.234567e+06' && '%s'.format([100000.0]) == '100000'",
        # on a device, as a DRA selector uses them
        'device.attributes["gpu.nvidia.com"].productName.lowerAscii().split(" ")[1] == "h200"',
        'device.attributes["gpu.nvidia.com"].productName.split(" ").join("-") == "NVIDIA-H200-NVL"',
        'cel.bind(name, device.attributes["gpu.nvidia.com"].productName, name.substring(name.lastIndexOf(" ") + 1))'
        ' == "NVL"',
    ],
)
def test_strings_extension_as_cel_go_documents_it(expression: str) -> None:
    assert holds(expression) is True


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("'hello'.charAt(-1) == ''", "index out of range: -1"),
        ("'hello mellow'.indexOf('ello', 20) == 0", "index out of range: 20"),
        ("'hello mellow'.lastIndexOf('ello', -1) == 0", "index out of range: -1"),
        ("'tacocat'.substring(-1) == ''", "index out of range: -1"),
        ("'tacocat'.substring(2, 1) == ''", "invalid substring range. start: 2, end: 1"),
        ("'%d %d %d'.format([1, 2]) == ''", "index 2 out of range"),
        ("'%d'.format(['x']) == ''", "decimal clause can only be used on integers, was given string"),
        ("dyn([1]).join() == ''", "type conversion error from 'int' to 'string'"),
    ],
)
def test_strings_extension_errors_are_cel_gos(expression: str, reason: str) -> None:
    assert reason in runtime_reason(expression)


def test_functions_beyond_kubernetes_strings_version_are_refused_at_compile_time() -> None:
    with pytest.raises(SelectorCompileError) as raised:
        compile_selector("'abc'.reverse() == 'cba'")  # strings v3; Kubernetes enables v2
    assert "function 'reverse' is not supported" in raised.value.reason
    with pytest.raises(SelectorCompileError) as raised:
        compile_selector("'abc'.charAt('1') == 'b'")
    assert "found no matching overload for 'charAt' applied to 'string.(string)'" in raised.value.reason


def test_a_semver_attribute_compared_with_a_plain_string_is_a_type_error() -> None:
    version = 'device.attributes["gpu.nvidia.com"].driverVersion'
    assert runtime_reason(f'{version} == "550.54.15"') == "no such overload: _==_(kubernetes.Semver, string)"
    # cel-go asks the left operand: a string is simply unequal to a semver, and `!=` is true unless Equal says true.
    assert holds(f'"550.54.15" == {version}') is False
    assert holds(f'{version} != "550.54.15"') is True
    assert holds(f'{version} == semver("550.54.15")') is True
    quantity = 'dyn(device.capacity["gpu.nvidia.com"].memory)'  # a capacity is typed: `==` a string does not compile
    assert runtime_reason(f'{quantity} == "141Gi"') == "no such overload: _==_(kubernetes.Quantity, string)"


def test_an_evaluation_past_the_cost_limit_is_cancelled() -> None:
    """The estimate cannot know a published string's length; evaluation counts and stops, as Kubernetes does."""
    expression = 'cel.bind(s, device.attributes["gpu.nvidia.com"].text, s.split("").all(c, s.contains(c)))'
    short = {**DEVICE, "attributes": {"text": {"string": "x" * 100}}}
    assert holds(expression, short) is True  # 100 iterations of a 10-unit contains
    long = {**DEVICE, "attributes": {"text": {"string": "x" * 5000}}}  # 5000 x 500: over 1,000,000
    assert runtime_reason(expression, long) == "operation cancelled: actual cost limit exceeded"
    # The limit is not an error value that `||` or `exists` could absorb.
    assert runtime_reason(f"true && ({expression} || true)", long) == "operation cancelled: actual cost limit exceeded"
