"""An author-year bibliography that matches the author-year citations in the text.

The chapters cite with ``bibtex_reference_style: author_year``, so the text reads
"Su et al. (2024)".  sphinxcontrib-bibtex's default bibliography style ("alpha") labels
the same work "[SAL+24]", which a reader cannot match to the text.  This extension
registers the pybtex formatting style ``author_year``: entries as in pybtex's "unsrt",
labelled and sorted by author and year, with the same name rules as the in-text
citations (one name, "A and B", or "A et al.").  A work with no author or editor is
labelled by its title, as the in-text citation falls back to the title too.  Two works
with the same label get "a", "b", ... after the year.

Select it with ``bibtex_default_style: author_year``.

It also registers the citation style ``author_year_round`` for
``bibtex_reference_style``: sphinxcontrib-bibtex's ``author_year`` with round brackets
and "; " between works, "(Su et al., 2024; Press et al., 2022)" and "Su et al. (2024)",
as author-year citations are usually written; square brackets stay with the list labels.
"""

import dataclasses
import re
from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle
from sphinxcontrib.bibtex.plugin import register_plugin as register_citation_style
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

STYLE_NAME = "author_year"
CITATION_STYLE_NAME = "author_year_round"


def _plain(latex: str) -> str:
    """Render a BibTeX string ("Kaiser, {\\L}ukasz", "{Llama Team}") as plain text."""
    return Text.from_latex(latex).render_as("text").strip()


def _surname(person) -> str:
    return _plain(" ".join(person.prelast_names + person.last_names))


def _title_words(entry, limit=6) -> str:
    """A short title for a work with no author: brackets (supplied titles) removed."""
    title = _plain(entry.fields.get("title", "")).strip("[]")
    words = title.split()
    return " ".join(words[:limit]) + (" ..." if len(words) > limit else "")


def author_part(entry) -> str:
    """The author part of the label, as the in-text author-year citation writes it."""
    persons = entry.persons.get("author") or entry.persons.get("editor")
    if not persons:
        return _title_words(entry)
    if len(persons) == 1:
        return _surname(persons[0])
    if len(persons) == 2:
        return f"{_surname(persons[0])} and {_surname(persons[1])}"
    return f"{_surname(persons[0])} et al."


def _year(entry) -> str:
    return re.sub(r"\s+", " ", entry.fields.get("year", "n.d.")).strip()


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels such as "Vaswani et al., 2017"; clashes get 2017a, 2017b."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        bases = [f"{author_part(e)}, {_year(e)}" for e in entries]
        counts = Counter(bases)
        seen = Counter()
        for base in bases:
            if counts[base] == 1:
                yield base
            else:
                yield base + "abcdefghijklmnopqrstuvwxyz"[seen[base]]
                seen[base] += 1


class AuthorYearSortingStyle(BaseSortingStyle):
    """Alphabetical by the label's author part, then year, then title."""

    def sorting_key(self, entry):
        return (author_part(entry).lower(), _year(entry), _plain(entry.fields.get("title", "")))


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabelStyle
    default_sorting_style = AuthorYearSortingStyle


def _round():
    return BracketStyle(left="(", right=")", sep="; ")


@dataclasses.dataclass
class RoundAuthorYearReferenceStyle(AuthorYearReferenceStyle):
    bracket_textual: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_parenthetical: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_author: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_label: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_year: BracketStyle = dataclasses.field(default_factory=_round)


def setup(app):
    register_plugin("pybtex.style.formatting", STYLE_NAME, AuthorYearStyle)
    register_citation_style(
        "sphinxcontrib.bibtex.style.referencing",
        CITATION_STYLE_NAME,
        RoundAuthorYearReferenceStyle,
    )
    return {"parallel_read_safe": True, "parallel_write_safe": True}
