"""The web lab's tabs, one module each; `app.py` assembles them into the page.

Each tab module has plain view functions of `(engine, inputs)` that return data (tested without a browser)
and a `build(page)` that makes the tab's widgets inside the page's `gr.Tab` and wires them; its callbacks
return `{component: value}` dicts. Page code runs no query: it asks `lab` (`lab.runs`, `lab.results`,
`lab.proposals`, `lab.loop`, `lab.worker`) for what it shows and for what a click does.
"""
