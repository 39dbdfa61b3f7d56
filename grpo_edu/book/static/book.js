// Typesets the page's maths with KaTeX (shipped in _static/katex, no network).
// markdown-it marks each formula: <span class="math inline"> for $...$ in a sentence,
// <div class="math ..."> for a displayed one. A formula KaTeX cannot parse is reported on
// the console (the site's browser test fails on console errors) and left as its source.
"use strict";

function typesetMaths(root) {
  const start = performance.now();
  let done = 0;
  for (const element of root.querySelectorAll(".math")) {
    const source = element.textContent;
    try {
      katex.render(source, element, { displayMode: element.tagName === "DIV", throwOnError: true });
      done += 1;
    } catch (error) {
      element.classList.add("math-error");
      console.error(`KaTeX cannot typeset ${JSON.stringify(source)}: ${error.message}`);
    }
  }
  document.documentElement.dataset.mathsMs = (performance.now() - start).toFixed(1);
  document.documentElement.dataset.mathsTypeset = String(done);
}

document.addEventListener("DOMContentLoaded", () => typesetMaths(document));
