"""The newest migration (storage/migrations/versions), as the tests that migrate a database expect it: a new
migration moves it."""

HEAD = "0017"
