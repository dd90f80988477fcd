"""Thin integrations with other libraries (bitsandbytes today)."""
