"""The local engine's named errors (shared by the patches and their registry)."""


class MotoVersionError(RuntimeError):
    """The installed moto is outside the range the patches support, or an attribute a patch
    replaces is gone or changed shape (the message names the patch and what changed)."""
