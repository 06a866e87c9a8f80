"""What the operator's commands run: jobs, their views, replay, the configuration checks."""
