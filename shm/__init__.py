"""shm package."""
