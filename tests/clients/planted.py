"""What the framework clients of this folder print about their planted leak."""


def leak_line(path, mode):
    """The line of the client at `path` marked `# LEAK_SITE(mode)`, 0 when none is."""
    with open(path) as f:
        for number, text in enumerate(f, 1):
            if "# LEAK_SITE(%s)" % mode in text:
                return number
    return 0
