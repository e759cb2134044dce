"""Property: any text, and any mutation of a valid study file, loads to a valid study or fails with a
SpecError (the CLI's exit 2): never another exception, never a hang."""

import copy
from collections import Counter

import yaml
from conftest import TINY_STUDY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from studyrunner.errors import SpecError
from studyrunner.study import compile_study, loads

ADDITION_STUDY = """\
name: add
task: {name: addition, params: {digits: 2, train_operands: [2], eval_operands: [2, 3]}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 2, pos: rope, rope_base: 100}}
train: {steps: 10, batch_size: 8, lr: 1.0e-3, warmup_steps: 1, betas: [0.9, 0.95]}
eval: {every: 5, examples: 16}
zip:
  - {model.params.loops: [1, 2], model.params.block_layers: [2, 1]}
exclude: [{model.params.loops: 2}]
seeds: [0, 3]
metric: {name: eval_exact_match_n3, mode: max}
"""
BASES = [yaml.safe_load(TINY_STUDY), yaml.safe_load(ADDITION_STUDY)]
SETTINGS = settings(
    max_examples=500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


SEEN: Counter = Counter()  # outcomes, so a run can show it exercised both sides


def outcome(text: str) -> None:
    """The property itself: a compiled study, or a one-line SpecError; anything else fails the test."""
    try:
        compiled = compile_study(loads(text, source="p.yaml"))
    except SpecError as exc:
        message = str(exc)
        assert message.startswith("p.yaml") and "\n" not in message, message
        SEEN["error"] += 1
        return
    SEEN["valid"] += 1
    study = compiled.study
    assert len(compiled.trials) == len(compiled.cells) * len(study.seeds)
    assert len({t.trial_key for t in compiled.trials}) == len(compiled.trials)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 4, 8, 16, 0.5, 1e-3, 1e12, -1, "4", "yes", "off", "", "rope", "rmsnorm", "phop"]),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
known_paths = st.sampled_from(
    [
        "model.params.loops",
        "model.params.block_layers",
        "model.params.d_model",
        "model.params.n_heads",
        "model.params.pos",
        "model.params.norm",
        "model.family",
        "task.name",
        "task.params.seq_len",
        "task.params.hops",
        "task.params.digits",
        "train.lr",
        "train.steps",
        "train.warmup_steps",
        "train.betas",
        "eval.examples",
        "model",
        "nothing.here",
        "model.params",
        "task.params.alphabet.x",
    ]
)


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths_of(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths_of(v, (*prefix, i))


def set_at(doc, path, value):
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def delete_at(doc, path):
    if not path:
        return doc
    node = doc
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return doc


@st.composite
def mutated_documents(draw):
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(paths_of(doc))
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["replace", "delete", "add_key", "grid", "zip", "exclude", "seeds", "metric"]))
        if kind == "replace":
            doc = set_at(doc, path, draw(values))
        elif kind == "delete" and path:
            doc = delete_at(doc, path)
        elif kind == "add_key" and isinstance(doc, dict):
            doc[draw(st.text(max_size=8))] = draw(values)
        elif kind == "grid" and isinstance(doc, dict):
            doc.setdefault("grid", {})
            if isinstance(doc["grid"], dict):
                doc["grid"][draw(known_paths)] = draw(st.lists(values, max_size=4))
        elif kind == "zip" and isinstance(doc, dict):
            n = draw(st.integers(0, 3))
            doc["zip"] = [{draw(known_paths): draw(st.lists(values, min_size=n, max_size=n)) for _ in range(2)}]
        elif kind == "exclude" and isinstance(doc, dict):
            doc["exclude"] = [{draw(known_paths): draw(values)}]
        elif kind == "seeds" and isinstance(doc, dict):
            doc["seeds"] = draw(st.lists(st.one_of(st.integers(-5, 2**64), scalars), max_size=4))
        elif kind == "metric" and isinstance(doc, dict):
            name = draw(st.sampled_from(["eval_accuracy", "eval_loss", "eval_accuracy_n2", "nope", "Eval", "x" * 70]))
            doc["metric"] = {"name": name, "mode": draw(st.sampled_from(["max", "min", "median"]))}
    return doc


def dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)  # non-finite floats become .inf/.nan


@SETTINGS
@given(mutated_documents())
def test_mutated_study_files_compile_or_fail_with_one_spec_error(doc):
    outcome(dump(doc))


@SETTINGS
@given(
    st.sampled_from([TINY_STUDY, ADDITION_STUDY]),
    st.lists(
        st.tuples(
            st.integers(0, 2000),
            st.integers(0, 8),
            st.one_of(
                st.text(max_size=6),
                st.sampled_from(
                    ["\x00", "&a ", "*a", "<<: *a\n", "[", "{", ": ", "\n  ", ".inf", "!!python/object ", "\t"]
                ),
            ),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_text_edits_of_study_files_compile_or_fail_with_one_spec_error(base, edits):
    text = base
    for position, cut, insert in edits:
        position %= len(text) + 1
        text = text[:position] + insert + text[position + cut :]
    outcome(text)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=300))
def test_arbitrary_text_is_a_study_or_one_spec_error(text):
    outcome(text)


def test_the_properties_saw_valid_and_invalid_files():
    """Runs after the property tests in this module: both outcomes must have been exercised."""
    if sum(SEEN.values()) < 1000:  # this test was run on its own
        return
    assert SEEN["valid"] >= 20 and SEEN["error"] >= 500, SEEN
