"""DRA CEL selectors: Kubernetes' verdicts (k8s.io/dynamic-resource-allocation/cel compile_test.go and the
apiserver quantity and semver library tests) reproduced on cel-python, plus Berth's caching contract."""

from __future__ import annotations

import copy

import pytest

from scheduler.cel import (
    DeviceError,
    SelectorCompileError,
    SelectorRuntimeError,
    compilation_count,
    compile_selector,
    evaluation_count,
    prepare_device,
)

H200 = {
    "name": "gpu-0",
    "driver": "gpu.nvidia.com",
    "attributes": {
        "productName": {"string": "H200"},
        "gpu.nvidia.com/cudaMajor": {"int": 12},
        "driverVersion": {"version": "550.54.15"},
        "mig": {"bool": False},
        "nvlink": {"bool": True},
        "topology.example.com/rack": {"string": "r7"},
    },
    "capacity": {"memory": {"value": "141Gi"}, "topology.example.com/slots": {"value": "8"}},
}
EMPTY = {"name": "nothing", "driver": "", "attributes": {}, "capacity": {}}


def holds(expression: str, device: dict = H200) -> bool:
    return compile_selector(expression).matches(device)


def runtime_error(expression: str, device: dict = H200) -> SelectorRuntimeError:
    with pytest.raises(SelectorRuntimeError) as raised:
        holds(expression, device)
    return raised.value


def compile_error(expression: str) -> SelectorCompileError:
    with pytest.raises(SelectorCompileError) as raised:
        compile_selector(expression)
    return raised.value


# --- the device variable ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.nvidia.com"', True),
        ('device.attributes["gpu.nvidia.com"].productName == "H200"', True),  # bare name: the driver's domain
        ('device.attributes["gpu.nvidia.com"].productName == "H100"', False),
        ('device.attributes["gpu.nvidia.com"]["productName"] == "H200"', True),
        ('device.attributes["gpu.nvidia.com"].cudaMajor == 12', True),  # qualified with the driver's domain
        ('device.attributes["gpu.nvidia.com"].cudaMajor >= 13', False),
        ('device.attributes["topology.example.com"].rack == "r7"', True),  # another domain
        ('device.attributes["gpu.nvidia.com"].nvlink', True),
        ('device.attributes["gpu.nvidia.com"].mig', False),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.100.0"))', False),
        ('device.attributes["gpu.nvidia.com"].driverVersion == semver("550.54.15")', True),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) == 0', True),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("140Gi"))', True),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("141Gi"))', False),
        ('device.capacity["topology.example.com"].slots == quantity("8")', True),
        ('device.attributes.exists_one(d, d == "gpu.nvidia.com")', True),
        ('device.capacity["gpu.nvidia.com"].exists_one(name, name == "memory")', True),
        ('"gpu.nvidia.com" in device.attributes', True),
        ('"nvidia.com" in device.attributes', False),
    ],
)
def test_published_attributes_and_capacity_are_visible_by_domain(expression: str, expected: bool) -> None:
    assert holds(expression) is expected


def test_a_device_without_driver_has_an_empty_driver_name() -> None:
    assert holds('device.driver == ""', EMPTY)


# --- missing attributes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.nvidia.com"].noSuchAttr == "x"',
        'device.attributes["gpu.nvidia.com"]["noSuchAttr"] == "x"',
        'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
        'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))',
    ],
)
def test_reading_a_missing_attribute_is_a_runtime_error(expression: str) -> None:
    assert "no such key: noSuchAttr" in runtime_error(expression).reason


def test_a_runtime_error_names_the_expression_and_where_it_failed() -> None:
    expression = 'device.attributes["gpu.nvidia.com"].noSuchAttr == "x"'
    error = runtime_error(expression)
    assert (error.expression, error.line, error.column) == (expression, 1, 37)
    assert str(error) == f"CEL selector {expression!r} failed at 1:37: no such key: noSuchAttr"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('has(device.attributes["gpu.nvidia.com"].noSuchAttr)', False),
        ('has(device.attributes["gpu.nvidia.com"].productName)', True),
        ('has(device.attributes["no-such-domain"].productName)', False),
        ('"noSuchAttr" in device.attributes["gpu.nvidia.com"]', False),
        ('"no-such-domain" in device.attributes', False),
        ('"memory" in device.capacity["gpu.nvidia.com"]', True),
        # Kubernetes' guard idioms: the test keeps the missing attribute from being read.
        (
            '!("vram" in device.capacity["gpu.nvidia.com"]) || device.capacity["gpu.nvidia.com"].vram.isGreaterThan(quantity("1Ki"))',
            True,
        ),
        ('has(device.attributes["gpu.nvidia.com"].vram) && device.attributes["gpu.nvidia.com"].vram > 1', False),
    ],
)
def test_missing_attributes_can_be_tested_for(expression: str, expected: bool) -> None:
    assert holds(expression) is expected


# --- quantity library ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("1Gi") == quantity("1024Mi")',
        'quantity("1Gi").compareTo(quantity("1024Mi")) == 0',
        '!quantity("1Gi").isGreaterThan(quantity("1024Mi")) && !quantity("1Gi").isLessThan(quantity("1024Mi"))',
        'quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")',
        'quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M")',
        'quantity("200M") != quantity("0.3G")',
        'quantity("50M").isLessThan(quantity("50Mi"))',
        '!quantity("100M").isLessThan(quantity("50M"))',
        'quantity("50Mi").isGreaterThan(quantity("50M"))',
        '!quantity("50M").isGreaterThan(quantity("100M"))',
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").compareTo(quantity("50M")) == 1',
        'quantity("50k").add(quantity("20")) == quantity("50.02k")',
        '!quantity("50k").add(20).isLessThan(quantity("50020"))',
        'quantity("50k").sub(quantity("20")) == quantity("49.98k")',
        'quantity("50k").sub(20) == quantity("49980")',
        'quantity("50k").add(20).sub(quantity("100k")).asInteger() == -49980',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20',
        'quantity("50k").asInteger() == 50000',
        'quantity("141Gi").asInteger() == 151397597184',
        'quantity("50").isInteger()',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        '!quantity("1.5Gi").isInteger()',  # apimachinery keeps fractional input as a decimal
        'quantity("50.703k").asApproximateFloat() == 50703.0',
        'quantity("1.5Gi").asApproximateFloat() == 1610612736.0',
        'sign(quantity("-50k")) == -1 && sign(quantity("0")) == 0 && sign(quantity("1m")) == 1',
        'isQuantity("20") && isQuantity("20M") && isQuantity("20Mi") && isQuantity("1e3")',
        '!isQuantity("20Mo") && !isQuantity("10Mm") && !isQuantity("200K") && !isQuantity("Mi")',
        'quantity("1e3") == quantity("1k") && quantity("1E-3") == quantity("1m")',
        'quantity("1n") == quantity("0.001u") && quantity("1P") == quantity("1000T")',
        'quantity("1Ei") == quantity("1024Pi") && quantity("1Ti") == quantity("1024Gi")',
        'quantity("0.1n") == quantity("1n")',  # finer than a nano rounds away from zero
        'quantity("9Ei") == quantity("9223372036854775807")',  # binary quantities cap at 2^63-1
    ],
)
def test_quantity_library_matches_kubernetes(expression: str) -> None:
    assert holds(expression, EMPTY)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ('sign(quantity("10Mo")) == 0', "quantities must match the regular expression"),
        ('sign(quantity("141Gx")) == 0', "quantities must match the regular expression"),
        ('sign(quantity("10Mm")) == 0', "unable to parse quantity's suffix"),
        ('quantity("9999999999999999999999999999999999999G").asInteger() > 0', "cannot convert value to integer"),
        ('quantity("1.5Gi").asInteger() > 0', "cannot convert value to integer"),
    ],
)
def test_quantity_parse_and_conversion_errors_are_runtime_errors(expression: str, reason: str) -> None:
    assert reason in runtime_error(expression, EMPTY).reason


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("isQuantity([1, 2, 3])", "found no matching overload for 'isQuantity' applied to '(list(int))'"),
        ('quantity("1Gi") < quantity("2Gi")', "found no matching overload for '_<_'"),
        ('quantity("1Gi").isGreaterThan(1)', "found no matching overload for 'isGreaterThan'"),
        ('quantity("1Gi").isGreaterThan(semver("1.0.0"))', "found no matching overload for 'isGreaterThan'"),
        ('quantity("1Gi") == "1Gi"', "found no matching overload for '_==_'"),
        ('quantity("-1").sign() == -1', "found no matching overload for 'sign' applied to 'kubernetes.Quantity.()'"),
        (
            'device.capacity["gpu.nvidia.com"].memory',
            "must evaluate to bool or the unknown type, not kubernetes.Quantity",
        ),
    ],
)
def test_quantity_type_errors_are_compile_errors(expression: str, reason: str) -> None:
    assert reason in compile_error(expression).reason


# --- semver library ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
        'semver("1.2.3") == semver("1.2.3") && semver("1.2.3") != semver("1.0.0")',
        'semver("1.0.0").isLessThan(semver("1.2.3")) && !semver("1.0.0").isLessThan(semver("1.0.0"))',
        'semver("1.2.3").isGreaterThan(semver("1.0.0")) && !semver("1.0.0").isGreaterThan(semver("1.0.0"))',
        'semver("1.2.3").compareTo(semver("1.2.3")) == 0',
        'semver("1.0.0").compareTo(semver("1.2.3")) == -1 && semver("1.2.3").compareTo(semver("0.1.2")) == 1',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
        'semver("1.0.0-alpha.beta").isLessThan(semver("1.0.0-beta.2"))',
        'semver("1.0.0-beta.2").isLessThan(semver("1.0.0-beta.11"))',  # numeric identifiers compare as numbers
        'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
        'semver("1.0.0+build.1") == semver("1.0.0+build.2")',  # build metadata does not count
        'isSemver("1.2.3-beta.1+build.1") && !isSemver("") && !isSemver("v1.0.0") && !isSemver("01.01.01")',
        '!isSemver(" 1.0.0") && !isSemver("1.0.0 ") && !isSemver("1") && !isSemver("1.1")',
        'isSemver("v1.0.0", true) && isSemver("01.01.01", true) && isSemver("1", true) && !isSemver(" 1.0.0", true)',
        'semver("v01.01", true) == semver("1.1.0")',
        'semver("v0.0.1", true).isLessThan(semver("1.0.0"))',
    ],
)
def test_semver_library_matches_kubernetes(expression: str) -> None:
    assert holds(expression, EMPTY)


def test_semver_errors() -> None:
    assert "No Major.Minor.Patch elements found" in runtime_error('semver("v1.0").major() == 1', EMPTY).reason
    assert "found no matching overload for 'isSemver'" in compile_error("isSemver([1, 2, 3])").reason
    mismatch = runtime_error('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(quantity("1"))')
    assert "no such overload" in mismatch.reason


# --- cel.bind ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.productName == "H200" && gpu.cudaMajor >= 12)', True),
        ('cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.nvlink)', True),
        ("cel.bind(a, 2, cel.bind(b, a * 3, b == 6))", True),
        ("cel.bind(x, 1, cel.bind(x, 2, x == 2))", True),  # the inner binding shadows
        ('cel.bind(x, device.attributes["nowhere"].missing, true)', True),  # an unused value cannot fail
        ("[1, 2, 3].all(n, cel.bind(double, n * 2, double > n))", True),
    ],
)
def test_cel_bind_names_a_subexpression(expression: str, expected: bool) -> None:
    assert holds(expression) is expected


def test_cel_bind_errors() -> None:
    assert "no such key: missing" in runtime_error('cel.bind(x, device.attributes["d"].missing, x == 1)').reason
    assert "cel.bind() takes a variable name" in compile_error('cel.bind("x", 1, true)').reason
    assert "undeclared reference to 'y'" in compile_error("cel.bind(x, 1, y == 1)").reason


# --- compile errors ---------------------------------------------------------------------------------------


def test_a_syntax_error_names_the_expression_and_position() -> None:
    error = compile_error("?!")
    assert (error.line, error.column) == (1, 1)
    assert error.reason.startswith("Syntax error")
    assert "'?!'" in str(error) and "1:1" in str(error)


def test_an_undeclared_identifier_is_a_compile_error_at_its_position() -> None:
    expression = 'device.driver == "gpu.nvidia.com" &&\n  devce.attributes["gpu.nvidia.com"].nvlink'
    error = compile_error(expression)
    assert (error.line, error.column) == (2, 3)
    assert error.reason == "undeclared reference to 'devce'"
    assert error.expression == expression
    assert "2:3" in str(error) and "devce.attributes" in str(error)


@pytest.mark.parametrize(
    ("expression", "reason", "column"),
    [
        ("1", "must evaluate to bool or the unknown type, not int", 1),
        ("device.driver", "must evaluate to bool or the unknown type, not string", 1),
        ('device.name == "gpu-0"', "undefined field 'name'", 8),
        ("device.allowMultipleAllocations == false", "undefined field 'allowMultipleAllocations'", 8),
        ("device.driver.size == 1", "type 'string' does not support field selection", 15),
        ('device.driver.reverse() == "x"', "function 'reverse' is not supported", 15),  # strings v3; Kubernetes: v2
        ("frobnicate(device.driver)", "undeclared reference to 'frobnicate'", 1),
        ('has(device.attributes["gpu.nvidia.com"]["productName"])', "invalid argument to has() macro", 1),
        ("[1, 2].all(1, true)", "all() takes a variable name and an expression", 8),
        ("[1, 2].all(x, x)", "the predicate of all() must be bool, not int", 8),
        ('device.driver == "a" && 1', "found no matching overload for '_&&_' applied to '(bool, int)'", 22),
        ('device.driver.exists(c, c == "a")', "cannot be the range of a comprehension", 15),
        ("9223372036854775808 > 0", "invalid int literal", 1),
    ],
)
def test_compile_errors(expression: str, reason: str, column: int) -> None:
    error = compile_error(expression)
    assert reason in error.reason
    assert (error.line, error.column) == (1, column)


def test_expressions_kubernetes_would_find_too_costly_or_long_do_not_compile() -> None:
    ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
    expensive = "true"
    for variable in ("x", "y", "z", "z2", "z3", "z4", "z5"):
        expensive = f"{ten}.all({variable}, {expensive})"
    assert "too complex, exceeds cost limit" in compile_error(expensive).reason
    assert holds(f"{ten}.all(x, {ten}.all(y, x * y <= 100))")  # a hundred steps is fine
    assert "longer than 10240 bytes" in compile_error("true || " * 1300 + "true").reason


# --- runtime errors and semantics -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ('device.attributes["gpu.nvidia.com"].productName', "CEL result of type string could not be converted to bool"),
        ('device.attributes["gpu.nvidia.com"].cudaMajor.exists(x, x > 0)', "expected iterable type, got int"),
        ('device.attributes["gpu.nvidia.com"].productName > 3', "no such overload: _>_(string, int)"),
        ('device.attributes["gpu.nvidia.com"].productName.major() == 1', "no such overload: major(string)"),
        ("[1, 2][2] == 1", "index out of bounds: 2"),
        ("[0, 1].all(x, 1 / x > 0)", "divide by zero"),
    ],
)
def test_runtime_errors(expression: str, reason: str) -> None:
    error = runtime_error(expression)
    assert reason in error.reason
    assert error.expression == expression


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.attributes["gpu.nvidia.com"].cudaMajor == "12"', False),  # different types: unequal, no error
        ('device.attributes["gpu.nvidia.com"].cudaMajor > 11.5', True),  # int and double compare by value
        ("[0, 1].exists(x, 1 / x > 0)", True),  # one true element decides despite the error
        ("[0, 1].all(x, 1 / x > 1)", False),  # one false element decides despite the error
        ("[1, 2, 3].map(x, x * 2).filter(x, x > 2).size() == 2", True),
        ("type(device.attributes) == map && type(1) == int", True),
        ('device.attributes["gpu.nvidia.com"].productName.matches("^H[0-9]+$")', True),
    ],
)
def test_cel_semantics_follow_cel_go(expression: str, expected: bool) -> None:
    assert holds(expression) is expected


def test_a_malformed_device_fails_while_matching_and_on_its_own() -> None:
    broken = copy.deepcopy(H200)
    broken["attributes"]["driverVersion"] = {"version": "550.54"}
    error = runtime_error('device.driver == "gpu.nvidia.com"', broken)
    assert "attribute driverVersion: parse semantic version" in error.reason
    with pytest.raises(DeviceError, match="capacity memory: quantities must match"):
        prepare_device({**H200, "capacity": {"memory": {"value": "141Gx"}}})
    with pytest.raises(DeviceError, match="unsupported attribute value"):
        prepare_device({**H200, "attributes": {"x": {"float": 1.5}}})


# --- compile once, evaluate once --------------------------------------------------------------------------


def test_an_expression_is_compiled_once_per_process() -> None:
    expression = 'device.driver == "compiled-once.example.com"'
    before = compilation_count()
    first = compile_selector(expression)
    assert compile_selector(expression) is first
    assert compilation_count() - before == 1


def test_each_expression_device_pair_is_evaluated_once() -> None:
    selector = compile_selector('device.attributes["gpu.nvidia.com"].productName == "H200" && "evaluated-once" != ""')
    renamed = {**copy.deepcopy(H200), "name": "gpu-7"}  # another device object with the same content
    before = evaluation_count()
    assert selector.matches(H200) and selector.matches(H200) and selector.matches(renamed)
    assert evaluation_count() - before == 1
    other = {**copy.deepcopy(H200), "attributes": {"productName": {"string": "B200"}}}
    assert not selector.matches(other)
    assert evaluation_count() - before == 2


def test_runtime_errors_are_remembered_too() -> None:
    selector = compile_selector('device.attributes["gpu.nvidia.com"].remembered == "x"')
    before = evaluation_count()
    for _ in range(3):
        with pytest.raises(SelectorRuntimeError, match="no such key: remembered"):
            selector.matches(H200)
    assert evaluation_count() - before == 1


def test_a_fleet_of_a_thousand_clusters_evaluates_once_per_distinct_device() -> None:
    classes = {
        product: {**copy.deepcopy(H200), "attributes": {"productName": {"string": product}}}
        for product in ("H200", "H100", "L40S")
    }
    pools = [copy.deepcopy(classes[product]) for _ in range(1000) for product in ("H200", "H100", "L40S", "H200")]
    pools += [prepare_device(classes[product]) for _ in range(1000) for product in ("H100", "L40S", "H200", "H100")]
    selectors = [
        compile_selector('device.attributes["gpu.nvidia.com"].productName.startsWith("H") && "fleet" != ""'),
        compile_selector('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0 && "fleet" != ""'),
    ]
    before = evaluation_count()
    matches = [[selector.matches(pool) for selector in selectors] for pool in pools]
    assert len(pools) == 8000
    assert sum(all(each) for each in matches) == 6000  # the H200 and H100 pools
    assert evaluation_count() - before == len(selectors) * len(classes)
