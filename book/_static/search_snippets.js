/* Search result snippets taken from the page text.
 *
 * Sphinx builds each result's snippet from the text of the page's [role="main"] element.
 * In sphinx-book-theme that element also holds the header above the article (launch,
 * download and full-screen buttons), the page's table of contents and the prev/next
 * links.  Sphinx also looks for the *stemmed* search term ("rotari" for "rotary"); when
 * the stem is not in the text it quotes the first 240 characters, which here are the
 * button labels: every snippet read "...Binder".
 *
 * This replaces two functions of Sphinx's `Search` object (searchtools.js) on the search
 * page: the text comes from the article alone, with white space collapsed, and the
 * snippet is centred on the first place the term, or failing that the longest prefix of
 * its stem (at least 4 letters), occurs.  Math delimiters are dropped from the snippet.
 */
(() => {
  "use strict";

  // Page furniture inside [role="main"] that is not the chapter's text.
  const CHROME = [".headerlink", "script", "style", ".bd-header-article", ".prev-next-area",
                  ".bd-sidebar-secondary"];

  const articleText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    for (const selector of CHROME) {
      doc.querySelectorAll(selector).forEach((el) => el.remove());
    }
    const article = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (!article) return "";
    let root = article;
    if (anchor) {
      try {
        root = article.querySelector(anchor) || article;
      } catch (e) {
        root = article;  // an anchor that is not a valid selector
      }
    }
    // Math is not typeset in a snippet: drop its \( \) \[ \] delimiters at least.
    return root.textContent.replace(/\\[()[\]]/g, "").replace(/\s+/g, " ").trim();
  };

  const firstMatch = (lowerText, keywords) => {
    for (const keyword of keywords) {
      const key = String(keyword).toLowerCase();
      for (let n = key.length; n >= Math.min(4, key.length); n--) {
        const at = lowerText.indexOf(key.slice(0, n));
        if (at >= 0) return at;
      }
    }
    return 0;
  };

  const snippet = (htmlText, keywords, anchor) => {
    const text = articleText(htmlText, anchor);
    if (text === "") return null;
    const at = firstMatch(text.toLowerCase(), keywords);
    let start = Math.max(at - 120, 0);
    if (start > 0) start = text.indexOf(" ", start) + 1 || start;  // start on a word
    const summary = document.createElement("p");
    summary.classList.add("context");
    summary.textContent = (start > 0 ? "..." : "") + text.substr(start, 240).trim() +
      (start + 240 < text.length ? "..." : "");
    return summary;
  };

  const install = () => {
    if (typeof Search === "undefined") return;  // not the search page
    Search.htmlToText = articleText;
    Search.makeSearchSummary = snippet;
  };

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", install);
  } else {
    install();
  }
})();
