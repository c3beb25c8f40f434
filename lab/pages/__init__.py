"""The web lab's tabs, one module each; `web` assembles them into the page (`envlab serve`, `python app.py`).

Each tab module has plain view functions of `(engine, inputs)` that return data (tested without a browser)
and a `build(page)` that makes the tab's widgets inside the page's `gr.Tab` and wires them; its callbacks
return `{component: value}` dicts. Page code runs no query: it asks `lab` (`lab.runs`, `lab.results`,
`lab.proposals`, `lab.loop`, `lab.jobs.worker`) for what it shows and for what a click does.

Beside the tabs, what they share: `common` (the page, tables, the board viewer), `figures`, `auth` (the guard
`web` puts in front of the page: hosts, logins, throttling) and `tempfiles` (uploads and exports, swept).
"""
