"""One task's life, in small units composed by the runner."""
