// Redraws the figures every few seconds, without reloading the page: the
// server reads Redis (the token stays there) and sends the frame's HTML.
const status = document.getElementById("status");
const every = Number(status.dataset.redrawMs) || 5000;

async function redraw() {
  try {
    // The plot is drawn at the page's width, so that a phone's reads.
    const width = Math.round(document.getElementById("live").clientWidth || window.innerWidth);
    const answer = await fetch("/live?w=" + width, { cache: "no-store" });
    const text = await answer.text();
    if (answer.ok) {
      document.getElementById("live").innerHTML = text;
      status.textContent = "read again every " + every / 1000 + " s; how old the figures are is below";
    } else {
      status.textContent = "the figures could not be read: " + text;
    }
  } catch (e) {
    status.textContent = "edge-limiter stats --serve cannot be reached: " + e;
  }
  setTimeout(redraw, every);
}

redraw();
