"""No chapter types a measured number into its prose: it is glued from the variable a check tests.

A number typed by hand into a sentence drifts from the data it restates when the data are
re-measured, and no assert notices (review of 2026-11-27; issue 34).  So the prose of every
chapter, the Markdown cells of ``book/*.ipynb`` and the pages ``book/*.md``, may hold a
number only

- glued: inside a ``{glue:...}`` role (``{glue:text}`key:.2f```), whose value a code cell
  computed, or in a paragraph that a code cell writes as Markdown (not scanned here: it is an
  output), or
- *defining*: on the chapter's short list in :data:`DEFINING`, with the reason it is not a
  measurement of this book's (a threshold, an aim, a constant of a formula, a setting of a
  run, or a number quoted from its source: a paper's reported result, a model's
  configuration), so no re-run can make it drift.

What counts as a number: a decimal (``1.34``, ``0.5``, ``2.5e-7``), a percentage (``12%``)
and a ratio written with a multiplication sign or "times" (``24×``, ``3x``, ``2 times``,
integer or not).  Plain integers are not flagged: they are mostly counts, lengths, seeds and
sizes, and a rule for them would drown the list in settings; a measured count in prose is
still a typed measured number, which review must catch.  Slash fractions (``3/4``) are not
flagged either: in this book they are constants of formulas.

Scanned: prose, headings, Markdown tables, math (``$...$``, ``$$...$$``, the ``{math}``
role: a constant of a formula goes on the list), inline code (a number typed in backticks in
a sentence is still typed), and the bodies of directives such as ``{note}`` and
``{figure}`` (captions; their ``:alt:`` option too).

Not scanned, as they hold no measured prose number:

- code blocks (fenced code, ``{code-cell}``, ``{code-block}``, ``{literalinclude}``...);
- roles that name something: glue, citations, cross-references, equation and figure
  references (``{glue:text}``, ``{cite:p}``, ``{ref}``, ``{numref}``, ``{eq}``, ``{doc}``);
- label and target lines (``(sec-x)=``) and directive options other than ``:alt:``;
- URLs and link targets; HTML comments;
- section numbers and numbered parts of a source: ``§4.2``, ``Section 3.1``,
  ``Appendix B.2``, ``Table 13``, ``Eq. (3.4)``, ``Lemma 1.2`` and the like;
- version numbers: any ``x.y.z``, and ``x.y`` after the name of a package or a model family
  (``PyTorch 2.13``, ``torch>=2.13``, ``Python 3.10``, ``Llama 3.1``);
- arXiv identifiers (``2108.12409v2``).

Figure captions and alt text stored in code-cell metadata (``mystnb.figure.caption``,
``mystnb.image.alt``) cannot hold a glue role and are not scanned by this test;
:func:`metadata_texts` lists them for review.

One test per chapter, so a failure names the chapter; a failure lists each number with its
cell and context, and any listed number that no longer occurs (a stale entry).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))

# chapter (file stem) -> {number as written: why it is defining, not measured}.  A number
# listed here may appear anywhere in that chapter.  Measured numbers are never listed.
DEFINING: dict[str, dict[str, str]] = {
    "performance": {},
    "alibi": {
        "0.5": "the exponent -0.5 of ALiBi's interleaved slopes 2^-0.5, 2^-1.5, ... (definition)",
        "1.5": "the same definition of the slopes",
        "2.5": "the same definition of the slopes",
        "3.5": "the same definition of the slopes",
        "1.3": "the paper's model size, quoted from Press et al. (2022), not measured here",
        "11": "the paper's reported 11% speed and memory saving, quoted, not measured here",
        "1": "the bound of the check on the far mass (below 1%)",
        "4": "the setting N = 4L of the example (4x the training length)",
        "5": "the bound of a check and of an exercise (less than 5% of the attention)",
    },
    "beyond_source_documents": {
        "0.4": "xPos's gamma = 0.4, a constant of its definition",
        "1.4": "1 + gamma, the same constant",
        "25.6": "0.4 * 64 in the closed form of zeta_31 (arithmetic on gamma and d)",
        "89.6": "1.4 * 64 in the same closed form",
        "1.5": "an exponent the Kerple check runs (a setting)",
        "1.9": "an exponent the Kerple check runs (a setting)",
        "95": "the confidence level of the t-intervals (a choice)",
        "2.05": "a grid point of the exponent scan in the exercise (a setting)",
    },
    "choosing_a_scheme": {
        "0.5": "the standard deviation of the perturbation of every learned number (a setting)",
        "25": "GPT-NeoX's configuration, 24 of 96 features (arithmetic on the config)",
        "3.1": "the model name Llama 3.1",
        "0.4": "xPos's gamma",
        "1.4": "1 + gamma",
        "0.1": "the threshold the exercise sets",
        "0.25": "p of Gemma 4's global layers, quoted from transformers 5.23 configuration_gemma4",
    },
    "complex_derivation": {
        "0.5": "the threshold of the check on the run-to-run difference (a bound)",
        "0.3": "the frequency of the perturbation 1 + a sin(0.3 m) (a setting)",
        "0.1": "an amplitude the check runs (a setting)",
    },
    "encoding_requirements": {
        "0.5": "arithmetic of the worked example: position 10 of 21 tokens as a fraction",
        "0.1": "the same example: one token in 10",
        "0.05": "the same example: one token in 20",
        "100": "the raw index is unseen in every position beyond training by construction",
    },
    "lab_language_models": {
        "95": "the confidence level of the t-intervals (a choice)",
        "0.9": "the threshold of the passkey proposition (frozen in propositions.py)",
        "90": "the level of the TOST interval, two one-sided tests at 5% (a choice)",
        "1.6": "a threshold the exercise sets",
        "2.5": "a threshold the exercise sets",
    },
    "learned_encodings": {
        "0.02": "BERT's initializer_range, a configuration value",
        "0.01": "GPT-2's standard deviation of the position table, a configuration value",
    },
    "length_extrapolation": {
        "0.1": "the former bar of a claim that was dropped (a definition, said as history)",
        "0.05": "the test level alpha (a choice fixed in the freeze)",
        "95": "the confidence level of the t- and Clopper-Pearson intervals (a choice)",
        "90": "the level of the TOST interval (two one-sided tests at 5%)",
    },
    "long_range_decay": {
        "3.59": "the minimum of (b + 1) / ln b, a constant of the proposition (checked below it)",
        "0.007": "ln b / (b + 1) at b = 10^3, arithmetic in the proposition",
        "32.5": "(d/2 + 1)/2 at d = 128, arithmetic",
        "0.56": "e^-gamma (Euler's constant), the estimate the exercise asks to test",
        "0.1": "the exercise's setting x / b",
    },
    "lab_flipflop": {
        "0.8": "p_ignore of FFL(0.8), the training and in-distribution task (a setting)",
        "0.98": "p_ignore of FFL(0.98), the sparse evaluation (a setting)",
        "0.1": "p_ignore of FFL(0.1), the dense evaluation, and the freeze's 0.1% bar",
        "0.01": "(1 - 0.98) / 2, arithmetic on the setting",
        "1": "the freeze's in-distribution bar (above 1%)",
        "20": "the freeze's sparse bar (above 20%)",
        "95": "the confidence level of the frozen rules",
        "99": "the confidence level of the grammar check",
        "0.05": "the level of the patterns' rule, fixed before their runs",
        "16": "2048 / 128, the evaluation length over the training length (settings)",
        "1e-6": "the tolerance of tests/test_layer_patterns.py",
    },
    "positions_since_2024": {
        "0.25": "p in transformers' Gemma 4 configuration, a configuration value quoted",
    },
    "relative_schemes": {
        "7": "Shaw et al.'s reported 7% fewer training steps per second, quoted",
        "0.0167": "1/60, arithmetic",
        "0.6": "a parameter of the example head (w = -0.6)",
        "0.5": "a parameter of the example head (w = 0.5)",
        "0.1": "the start of the check's parameter (w_h = -0.1)",
    },
    "rope": {"0.1": "YaRN's constant in sqrt(1/t) = 0.1 ln s + 1 (Peng et al., 2024)"},
    "sinusoid_intuitions": {"4": "the closed-form cost of concatenating at equal width (4x)"},
    "taylor_expansion": {
        "0.05": "the perturbation size epsilon of the example (a setting)",
        "0.5": "lambda of the bound (a setting)",
        "0.01": "the smallest step of the scan (a setting)",
    },
    "why_positions": {"5": "the margin of the test around the limit (a setting)"},
    "index": {"9.2": "an example of how equations are numbered"},
    "lab_recall": {
        "0": "a needle's depth as a share of the context: 0% is the first token (a setting)",
        "100": "the same: 100% is just before the query block (a setting)",
        "5": (
            "the 5% level of a test fixed before its run: the warmup ablation's sign test, and "
            "the moved bands' Holm-adjusted t-test (lab.lead_effects)"
        ),
        "95": "the confidence level of the t-intervals on the gains (a choice)",
        "90": "the level of the TOST interval, two one-sided tests at 5% (a choice)",
    },
}

# fenced blocks whose body is code or generated, not prose
CODE_DIRECTIVES = {
    "code-cell",
    "code-block",
    "code",
    "sourcecode",
    "literalinclude",
    "raw",
    "tableofcontents",
    "bibliography",
    "glue:figure",
    "glue:math",
    "glue:",
    "glue",
    "glue:any",
    "glue:md",
}
# roles whose content names something (a key, a citation, a target), never prose
NAMING_ROLES = re.compile(
    r"^(glue(:\w*)?|cite(:\w+)?|bibentry|ref|numref|eq|doc|download|term|any|prf:ref|label"
    r"|external(:[\w:+-]*)?|py:\w+|func|class|meth|mod|attr|data|obj|exc|envvar|option)$"
)
_FENCE = re.compile(
    r"^(?P<fence>`{3,}|~{3,}|:{3,})[ \t]*(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_ROLE = re.compile(r"\{(?P<name>[\w:+-]*)\}(?P<ticks>`+)(?P<content>.*?)(?P=ticks)", re.DOTALL)
_SOURCE_PART = (
    r"(?:§+|\b(?i:sections?|secs?\.|appendix|appendices|app\.|tables?|tab\.|figures?|figs?\."
    r"|equations?|eqs?\.|lemma|theorem|thm\.|propositions?|prop\.|corollary|definition"
    r"|algorithm|chapter|ch\.|remark|example|exercise|step|listing|part)\s*)"
)
_SECTION = re.compile(
    _SOURCE_PART + r"\(?[A-Z]?\d+(?:\.\d+)*\)?(?:\s*(?:[–-]|and|,)\s*\(?[A-Z]?\d+(?:\.\d+)*\)?)*"
)
_PACKAGES = (
    r"PyTorch|torch|Python|CUDA|cuDNN|NumPy|numpy|SciPy|scipy|Triton|triton|transformers"
    r"|Transformers|Jupyter Book|jupyter-book|MyST-NB|myst-nb|MyST|Sphinx|sphinx|JAX|jax"
    r"|matplotlib|pandas|hypothesis|ruff|mypy|nbval|pip|Chromium|Chrome|Playwright|Ubuntu"
    r"|macOS|Windows|Colab|versions?|releases?|v|Llama|LLaMA|Code ?Llama|GPT|Qwen|Gemma|Phi"
    r"|Mistral|Mixtral|Falcon|DeepSeek|Yi|InternLM|ChatGLM|OLMo"
)
_VERSION = re.compile(
    r"(?<![\w.])v?\d+\.\d+\.\d+[\w.+-]*"  # x.y.z and longer
    r"|(?:\b(?:" + _PACKAGES + r"))[ \t]*(?:[-=<>~!]=?|\s)?[ \t]*v?\d+(?:\.\d+)+[\w+-]*"
)
_ARXIV = re.compile(r"(?<![\w.])\d{4}\.\d{4,5}(?:v\d+)?(?![\w.])")
_URL = re.compile(r"<?https?://[^\s>)\]]+>?|\]\([^)]*\)|^\[[^\]]+\]:\s*\S+", re.MULTILINE)
_LABEL = re.compile(r"^\([\w:.-]+\)=[ \t]*$", re.MULTILINE)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.DOTALL)
_OPTION = re.compile(r"^:(?P<key>[\w-]+):[^\n]*$", re.MULTILINE)

# a number: thousands groups allowed; sign ignored; not part of a word or of a longer number
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+−]?\d+)?)"
    r"(?P<ratio>[ \t]?(?:×|\\times\b|x(?=\s+[A-Za-z]))(?![ \t]*[\d(]))?"
    r"(?P<percent>[ \t]?\\?%)?"
    r"(?P<times>\s+times(?=\s+(?:as|its|the|that|this|more|less|larger|smaller|faster|slower"
    r"|longer|shorter|higher|lower|bigger|over|above|below)\b))?"
    r"(?![\w.]\d|[\w])"
)


def _directive_body(match: re.Match[str]) -> str:
    """A fenced block: nothing for code, the body of a prose directive without its options."""
    info = match["info"].strip()
    name = info[1:].split("}")[0] if info.startswith("{") else None
    if name is None or name in CODE_DIRECTIVES:
        return "\n"  # a code block, or a fence with a language: code
    body = _OPTION.sub(lambda m: m[0] if m["key"] == "alt" else "", match["body"])
    return "\n" + _strip(body) + "\n"  # nested fences too


def _role(match: re.Match[str]) -> str:
    return " " if NAMING_ROLES.match(match["name"]) else f" {match['content']} "


def _strip(text: str) -> str:
    """``text`` with everything removed that holds no prose number (see the module doc)."""
    text = _COMMENT.sub(" ", text)
    text = _FENCE.sub(_directive_body, text)
    text = _LABEL.sub(" ", text)
    text = _ROLE.sub(_role, text)
    text = _URL.sub(" ", text)
    text = _ARXIV.sub(" ", text)
    text = _VERSION.sub(" ", text)
    return _SECTION.sub(" ", text)


def prose_numbers(text: str) -> list[tuple[str, str]]:
    """``(number, context)`` for every decimal, percentage or ratio left in ``text``'s prose."""
    clean = _strip(text)
    math = [m.span() for m in _MATH.finditer(clean)]
    found = []
    for m in _NUMBER.finditer(clean):
        num = m["num"]
        decimal = "." in num or "e" in num.lower()
        ratio = m["ratio"] or ""
        if ratio.strip() == "x" and any(a <= m.start() < b for a, b in math):
            ratio = ""  # $2x$ is a product with a variable x, not a ratio
        if decimal or ratio or m["percent"] or m["times"]:
            start, end = max(m.start() - 40, 0), min(m.end() + 25, len(clean))
            found.append((num, " ".join(clean[start:end].split())))
    return found


def prose_cells(path: Path) -> list[tuple[str, str]]:
    """``(where, Markdown)``: each Markdown cell of a notebook, or a whole ``.md`` page."""
    if path.suffix == ".md":
        return [("page", path.read_text())]
    cells = json.loads(path.read_text())["cells"]
    return [
        (f"cell {i}", "".join(c["source"]))
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown"
    ]


def metadata_texts(path: Path) -> list[tuple[str, str]]:
    """``(where, text)`` for figure captions and alt text kept in code-cell metadata."""
    if path.suffix != ".ipynb":
        return []
    found = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        mystnb = cell.get("metadata", {}).get("mystnb", {})
        for part, key in (("figure", "caption"), ("image", "alt")):
            text = mystnb.get(part, {}).get(key)
            if text:
                found.append((f"cell {i} {key}", text))
    return found


def findings(path: Path) -> tuple[list[str], list[str]]:
    """Typed numbers not on the chapter's list, and listed numbers that no longer occur."""
    allowed = DEFINING.get(path.stem, {})
    typed, seen = [], set()
    for where, text in prose_cells(path):
        for num, context in prose_numbers(text):
            seen.add(num)
            if num not in allowed:
                typed.append(f"{where}: {num!r} in '... {context} ...'")
    stale = [f"{num!r} ({why})" for num, why in allowed.items() if num not in seen]
    return typed, stale


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_no_typed_measured_number_in_prose(path):
    typed, stale = findings(path)
    message = []
    if typed:
        message.append(
            f"{path.name}: {len(typed)} number(s) typed into prose: glue each from the variable "
            "its check tests ({glue:text}`key:.2f`), write the paragraph from a code cell, or, "
            "if it defines something, list it in DEFINING with the reason:\n" + "\n".join(typed)
        )
    if stale:
        message.append(f"{path.name}: listed in DEFINING but not in the prose: " + ", ".join(stale))
    assert not message, "\n".join(message)


def glued_keys(path: Path) -> set[str]:
    """The keys a notebook's stored outputs glue (``myst_nb.glue``)."""
    keys = set()
    for cell in json.loads(path.read_text())["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                keys.add(name)
    return keys


NOTEBOOKS = [p for p in PAGES if p.suffix == ".ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_glue_role_has_a_stored_value(path):
    """A glue role whose key no stored output carries renders as a build warning, not a number."""
    stored = glued_keys(path)
    used = set()
    for _, text in prose_cells(path):
        for m in _ROLE.finditer(text):
            if m["name"].startswith("glue") and "::" not in m["content"]:
                used.add(m["content"].split(":")[0].strip())
    missing = sorted(used - stored)
    assert not missing, f"{path.name}: glue roles with no stored value (re-run it?): {missing}"


# --- the scanner itself: each case must be found, or must not -------------------------------


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("the fused path costs 1.34× SDPA", ["1.34"]),
        ("at 24 times its own steady state, 1.5 times as long", ["24", "1.5"]),
        ("at 24× its steady state, and 3x slower", ["24", "3"]),
        ("medians 1.06 normalised and 1.02 raw", ["1.06", "1.02"]),
        ("a loss of 12.5% and of 7 %", ["12.5", "7"]),
        ("an error of 2.5e-7, in math $0.1 \\ln s + 1$", ["2.5e-7", "0.1"]),
        ("a ratio $1.34\\times$ and {math}`0.5`", ["1.34", "0.5"]),
        ("typed in code: `ratio = 0.87`", ["0.87"]),
        ("a range 0.62–1.77", ["0.62", "1.77"]),
        ("```{note}\nIt cost 1.5 s.\n```", ["1.5"]),
        (
            "```{figure} a.png\n:name: fig-a\n:alt: bars at 1.17 and 1.14\nCaption 0.97.\n```",
            ["1.17", "1.14", "0.97"],
        ),  # fmt: skip
        ("a table | 0.25 | 3 |", ["0.25"]),
    ],
)
def test_typed_numbers_are_found(text, numbers):
    assert [num for num, _ in prose_numbers(text)] == numbers


@pytest.mark.parametrize(
    "text",
    [
        "glued: {glue:text}`fused_worst:.2f`× and {glue}`x` and {glue:md}`y`",
        "{cite:p}`press2022alibi` (§4.2 and Appendix B.2, Table 13, Eq. (3.4), Section 3.1)",
        "{ref}`sec-1.2` and {numref}`fig-perf` and {eq}`eq-2.1`",
        "(perf-1.5-target)=\n# Title",
        "PyTorch 2.13, torch>=2.13, torch 2.13.0+cpu, `torch==2.13.0`, Python 3.10, Llama 3.1",
        "a link [here](https://example.org/v1.5/x) and <https://arxiv.org/abs/2108.12409>",
        "arXiv 2108.12409v2",
        "```python\nx = 0.5 * y\n```",
        "```{code-cell} ipython3\nx = 0.5\n```",
        "<!-- measured 1.5 -->",
        "integers only: 29 of 30 seeds, n = 1000, shape (1, 8, 2048, 64), 2^{20}, 16,640",
        "a matrix of 2 × 2 and a product 256 × 4 = 1024, 3x3 kernels",
        "the octave $[x, 2x]$ and $2x + 1$, a sign change 80 times and 3 times in a row",
        "RoFormer (section 3.3) and Sec. 4.1",
        "a fraction 3/4 and 13/11",
        "end of a sentence 2. Next",
    ],
)
def test_what_is_not_a_typed_number(text):
    assert prose_numbers(text) == []


def test_a_listed_number_passes_and_a_stale_one_is_reported(tmp_path, monkeypatch):
    page = tmp_path / "demo.md"
    page.write_text("The aim is 1.2× and the median was 1.17×.\n")
    monkeypatch.setitem(DEFINING, "demo", {"1.2": "the issue's aim", "2.5": "gone"})
    typed, stale = findings(page)
    assert [t.split(" in ")[0] for t in typed] == ["page: '1.17'"]
    assert stale == ["'2.5' (gone)"]
