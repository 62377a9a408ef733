"""The shipped YAML configurations (the repository's conf/ folder, installed as
``dist_dl.conf``): see dist_dl.app.config."""
