// App-portal entry: the token arrives in the URL fragment (never sent to a server). Take it
// out of the address bar at once, then trade it for a session cookie.
(function () {
  var match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  history.replaceState(null, "", window.location.pathname);
  if (!match) { window.location.replace("/login"); return; }
  var form = document.getElementById("portal");
  form.elements.token.value = decodeURIComponent(match[1]);
  form.submit();
})();
