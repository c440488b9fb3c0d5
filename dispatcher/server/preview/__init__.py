"""The preview gateway: sandbox ports opened to browsers (``OpenPort``), each behind a token."""
