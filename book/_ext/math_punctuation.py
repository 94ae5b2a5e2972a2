"""Keep the punctuation around inline math on the formula's line.

pydata-sphinx-theme lays inline math out as an ``inline-flex`` box (which lets a long
formula scroll, see posenc.css).  Chromium may break a line between such a box and the
text that touches it, so a full stop or a comma after a formula could start the next
line, and an opening parenthesis end the previous one.  This transform puts each inline
formula together with the punctuation that touches it (no space between) in one
``<span class="nowrap">``; the line can still break at every space around the group.
"""

import re

from docutils import nodes
from sphinx.transforms import SphinxTransform

AFTER = re.compile(r"^[.,;:!?)\]}\u2019\u201d'\"]+")
BEFORE = re.compile(r"[(\[{\u2018\u201c]+$")


class KeepPunctuationWithMath(SphinxTransform):
    default_priority = 900  # after the parsers and MyST's own transforms

    def apply(self, **kwargs):
        for math in list(self.document.findall(nodes.math)):
            parent = math.parent
            if parent is None or isinstance(parent, nodes.inline) and "nowrap" in parent["classes"]:
                continue
            index = parent.index(math)
            after = parent[index + 1] if index + 1 < len(parent) else None
            before = parent[index - 1] if index > 0 else None
            tail = AFTER.match(str(after)) if isinstance(after, nodes.Text) else None
            head = BEFORE.search(str(before)) if isinstance(before, nodes.Text) else None
            if not (tail or head):
                continue
            group = nodes.inline("", "", classes=["nowrap"])
            # Replace right to left so that the indices stay valid.
            if tail:
                rest = str(after)[tail.end() :]
                if rest:
                    parent[index + 1] = nodes.Text(rest)
                else:
                    del parent[index + 1]
            del parent[index]
            if head:
                kept = str(before)[: head.start()]
                if kept:
                    parent[index - 1] = nodes.Text(kept)
                else:
                    del parent[index - 1]
                    index -= 1
                group += nodes.Text(head.group(0))
            group += math
            if tail:
                group += nodes.Text(tail.group(0))
            parent.insert(index, group)


def setup(app):
    app.add_transform(KeepPunctuationWithMath)
    # env_version: a saved environment read without this transform is read again.
    return {"env_version": 1, "parallel_read_safe": True, "parallel_write_safe": True}
