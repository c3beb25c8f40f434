"""The lab's database: tables (`models`), engine, session and migrations (`db`), the one-decision rule
(`decisions`) and the job queue (`queue`). Knows nothing of envsim, lab or training: it stores JSON."""
