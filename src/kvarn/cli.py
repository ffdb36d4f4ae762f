"""The `kvarn` command line (placeholder, replaced below)."""
def main(argv=None):
    return 0
