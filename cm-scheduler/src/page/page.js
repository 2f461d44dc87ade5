(function () {
  var url = new URL(location.href);
  if (url.searchParams.has('done')) {
    url.searchParams.delete('done');
    url.searchParams.delete('of');
    history.replaceState(null, '', url);
  }
  var toggle = document.getElementById('live-toggle');
  var every = Number(document.body.dataset.refresh || 5) * 1000;
  var on = function () {
    return url.searchParams.get('live') !== 'off' && localStorage.getItem('cm-live') !== 'off';
  };
  var show = function () {
    toggle.textContent = on() ? 'Live updates: on' : 'Live updates: off';
    toggle.setAttribute('aria-pressed', String(on()));
  };
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener('click', function () {
      localStorage.setItem('cm-live', on() ? 'off' : 'on');
      show();
    });
    show();
  }
  var busy = function () {
    var focused = document.activeElement;
    return document.querySelector('#live details[open]') ||
      (focused && focused.closest && focused.closest('#live form'));
  };
  setInterval(function () {
    if (!on() || document.hidden || busy()) return;
    fetch(location.href, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (r) { return r.ok || r.status === 503 ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, 'text/html').getElementById('live');
        var now = document.getElementById('live');
        if (fresh && now && !busy()) now.replaceWith(fresh);
      })
      .catch(function () {});
  }, every);
})();
