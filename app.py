"""The envlab web lab's entry point in a checkout: `python app.py [--port N] [--db DB] ...` serves the page.

The page itself is `lab.pages.web` (installed with the package, and what `envlab serve` runs), so an installed
envlab adds no module named `app` to the site. Importing this file starts nothing: the page is built and served
under the `__main__` guard, as Gradio demos keep their `demo.launch()`; `build_demo` builds it for a test.
"""

from lab.pages.web import build_demo, main

__all__ = ["build_demo", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
