// Pages that follow something under way reload themselves every few seconds; the button
// turns that off (or on again) for the rest of the visit.
(function () {
  var button = document.getElementById("live-toggle");
  if (!button) { return; }
  var seconds = Number(button.getAttribute("data-seconds")) || 5;
  var off = window.sessionStorage.getItem("herald-live") === "off";
  var timer = null;
  function show() {
    button.setAttribute("aria-pressed", off ? "false" : "true");
    button.textContent = "Refreshing every " + seconds + " s: " + (off ? "off" : "on");
    if (timer) { window.clearTimeout(timer); timer = null; }
    if (!off) { timer = window.setTimeout(function () { window.location.reload(); }, seconds * 1000); }
  }
  button.addEventListener("click", function () {
    off = !off;
    window.sessionStorage.setItem("herald-live", off ? "off" : "on");
    show();
  });
  show();
})();
