"""The one exception type that means "the user's input is wrong": jobs print it as one line and exit 2."""


class InputError(ValueError):
    """Bad input (a missing model, a malformed row, an unknown config key); the message names it."""
