// MathJax 3 set-up for pymdownx.arithmatex (generic mode): \( \) inline, \[ \] and $$ $$ display.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

// MathJax typesets the page it is loaded on by itself. Material's `document$` emits for that page
// too, and again for every page that instant navigation (the theme's `navigation.instant`) swaps
// in without a reload. On each emission, once MathJax's own first pass is done, typeset whatever
// TeX is still in the document: nothing on the first page, the new content after a navigation.
// The CommonHTML output's font cache (MathJax.startup.output.clearCache) is left alone: clearing
// it removes the CSS rules that draw the characters of every formula already on the page, and
// nothing typesets those formulas again, so they stay blank.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      return; // MathJax is not loaded yet: its start-up typesets this page
    }
    MathJax.startup.promise = MathJax.startup.promise.then(() => {
      MathJax.typesetClear(); // forget the formulas of the page that was replaced
      MathJax.texReset(); // equation numbers and labels start afresh
      return MathJax.typesetPromise();
    });
  });
}
