"""Graph -> Graph transforms; pipeline.py lists them in order."""
