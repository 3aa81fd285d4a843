// calnotes: long names in DataFrame tables (test_confidence, ch01_measuring) may
// wrap after an underscore, so that a table with many columns fits the page without its
// names being broken in the middle of a word.
document.addEventListener("DOMContentLoaded", () => {
  for (const cell of document.querySelectorAll("table.dataframe th, table.dataframe td")) {
    for (const node of cell.childNodes) {
      if (node.nodeType === Node.TEXT_NODE && node.nodeValue.includes("_")) {
        node.nodeValue = node.nodeValue.replace(/_/g, "_\u200b");
      }
    }
  }
});
