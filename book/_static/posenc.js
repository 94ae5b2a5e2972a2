// The "Contents" button in the article header (sphinx-book-theme) has no handler of its
// own: pydata-sphinx-theme 0.17 opens the page's contents drawer only from the first
// `.secondary-toggle` on the page, the one in the top bar, which is hidden.  Forward the
// click, so the button works wherever it shows (below 1440 px, see posenc.css).
document.addEventListener("DOMContentLoaded", () => {
  const opener = document.querySelector(".bd-header .secondary-toggle");
  for (const button of document.querySelectorAll(".bd-header-article .secondary-toggle")) {
    if (opener && button !== opener) {
      button.addEventListener("click", (event) => {
        event.preventDefault();
        opener.click();
      });
    }
  }
});
