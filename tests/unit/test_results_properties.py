"""Property-based tests (Hypothesis) of what reads hostile input: the results.json reader, the renderers behind
`tune-advisor report`, and the BASELINE/SEARCH validator."""

import copy
import io
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from rich.console import Console

from tune_advisor import knobs, results
from tune_advisor.errors import UsageError
from tune_advisor.render import html, markdown, terminal, view

from ..conftest import ROOT

GOLDEN = results.read(ROOT / "tests" / "golden" / "cnn.results.json")
TMP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def write(tmp_path, text: str):
    path = tmp_path / "results.json"
    path.write_text(text, encoding="utf-8")
    return path


def read_or_refuse(path):
    """What `report` does first: a document, or UsageError (exit 2 with a message). Anything else is a bug."""
    try:
        return results.read(path)
    except UsageError as exc:
        assert str(path) in str(exc)
        return None


@TMP
@given(value=json_values)
def test_any_json_is_read_or_refused_with_a_message(tmp_path, value):
    document = read_or_refuse(write(tmp_path, json.dumps(value)))
    assert document is None or isinstance(document, dict)


@TMP
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_a_truncated_file_is_refused_as_cut_off(tmp_path, cut):
    text = json.dumps(GOLDEN, indent=1)
    path = write(tmp_path, text[: cut % len(text)])
    with pytest.raises(UsageError, match="it ends early: the file was cut off"):
        results.read(path)


@st.composite
def edited_documents(draw, base=GOLDEN):
    """`base` with a few values replaced or deleted anywhere in it, as a hand edit might."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        parent, key, node = None, None, document
        for _ in range(draw(st.integers(1, 5))):  # walk down a random path
            if isinstance(node, dict) and node:
                step = draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                step = draw(st.integers(0, len(node) - 1))
            else:
                break
            parent, key, node = node, step, node[step]
            if draw(st.booleans()):
                break
        if parent is None:
            continue
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[key]
        else:
            parent[key] = draw(json_values)
    return document


@TMP
@given(document=edited_documents())
def test_a_hand_edited_file_is_refused_or_renders(tmp_path, document):
    path = write(tmp_path, json.dumps(document))
    document = read_or_refuse(path)
    if document is not None:  # what the reader accepts, every text renderer renders
        view.build(document)
        markdown.render(document)
        terminal.document_summary(document, Console(file=io.StringIO()), results_path=path)


@settings(max_examples=8, deadline=None)  # a few: each HTML report draws its charts (about a second)
@given(document=edited_documents({**GOLDEN, "probes": GOLDEN["probes"][:4]}))
def test_a_hand_edited_file_that_is_accepted_renders_as_html(document, tmp_path_factory):
    path = write(tmp_path_factory.mktemp("html"), json.dumps(document))
    document = read_or_refuse(path)
    if document is not None:
        assert "</html>" in html.render(document)


@settings(TMP, max_examples=25)
@given(document=edited_documents())
def test_what_is_written_reads_back_the_same(tmp_path, document):
    document = {**document, "schema_version": results.SCHEMA_VERSION}
    path = tmp_path / "results.json"
    results.write_atomic(path, document)
    assert json.loads(path.read_text()) == document
    assert not list(tmp_path.glob("*.tmp"))


# --- the BASELINE/SEARCH validator ----------------------------------------------------------------------------


def valid_values(knob: knobs.Knob):
    """Every form a valid value may take in a workload file or on the command line, and the value it means."""
    if knob.type is bool:
        forms = [(v, v) for v in (True, False)] + [(t, t in ("1", "true", "yes", "on")) for t in
                                                    ("1", "true", "yes", "on", "0", "false", "no", "off")]
        return st.sampled_from(forms)
    if knob.type is int:
        return st.integers(min_value=knob.minimum or 0, max_value=10**6).flatmap(
            lambda n: st.sampled_from([(n, n), (str(n), n), (f" {n} ", n)]))
    return st.sampled_from([(c, c) for c in knob.choices])


valid_settings = st.lists(st.sampled_from(sorted(knobs.KNOBS)), unique=True).flatmap(
    lambda names: st.tuples(*(valid_values(knobs.KNOBS[n]) for n in names)).map(
        lambda pairs: (dict(zip(names, (form for form, _ in pairs))), dict(zip(names, (v for _, v in pairs))))))

hostile = st.none() | st.booleans() | st.integers(-10, 10**4) | st.floats() | st.text(max_size=6) | st.text(
    string.digits + "-+ ²٣", max_size=4) | st.lists(st.integers(), max_size=2)
knob_names = st.sampled_from(sorted(knobs.KNOBS)) | st.text(max_size=12)


@given(pair=valid_settings)
def test_valid_settings_parse_to_their_typed_values(pair):
    written, meant = pair
    parsed = knobs.validate_settings(written)
    assert parsed == meant and all(type(v) is knobs.KNOBS[k].type for k, v in parsed.items())
    assert knobs.validate_settings(parsed) == parsed  # parsing is idempotent


@given(raw=st.dictionaries(knob_names, hostile, max_size=4))
def test_any_settings_are_parsed_or_refused_naming_the_problem(raw):
    try:
        parsed = knobs.validate_settings(raw)
    except ValueError as exc:
        bad = next(k for k in raw if k not in knobs.KNOBS or _invalid(k, raw[k]))
        assert (f"unknown knob '{bad}'" if bad not in knobs.KNOBS else f"valid value for {bad}") in str(exc)
    else:
        assert set(parsed) == set(raw)
        assert all(knobs.KNOBS[k].parse(v) == v for k, v in parsed.items())


@given(raw=st.dictionaries(knob_names, st.lists(hostile, max_size=3) | hostile, max_size=3))
def test_any_search_is_parsed_or_refused_naming_the_knob(raw):
    try:
        parsed = knobs.validate_search(raw)
    except ValueError as exc:
        assert any(f"'{k}'" in str(exc) for k in raw)
    else:
        assert set(parsed) == set(raw) and all(isinstance(v, list) and v for v in parsed.values())


def _invalid(name, value) -> bool:
    try:
        knobs.KNOBS[name].parse(value)
    except ValueError:
        return True
    return False


def test_a_speedup_edited_into_non_numbers_is_refused_and_one_without_bounds_renders(tmp_path):
    # Hypothesis found this one: a confirmed speedup whose CI bound was edited into a list. The typed record
    # refuses it, naming the place (the renderers then never see a bound that is not a number)
    document = {**GOLDEN, "probes": GOLDEN["probes"][:4],
                "speedup": {**GOLDEN["speedup"], "ci_low": [], "method": {"not": "text"}}}
    with pytest.raises(UsageError, match=r"speedup\.ci_low: input should be a valid number"):
        results.read(write(tmp_path, json.dumps(document)))
    # AND a speedup whose bound and method were not recorded renders without them
    document["speedup"] = {**GOLDEN["speedup"], "ci_low": None, "method": None}
    document = read_or_refuse(write(tmp_path, json.dumps(document)))
    page = html.render(document)
    assert "</html>" in page and "no CI" in page
    markdown.render(document)
