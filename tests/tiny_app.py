"""`python -m tests.tiny_app run app.py ...`: streamlit with the tiny test models registered (browser tests)."""
import sys

from tests.tiny import register

if __name__ == "__main__":
    register()
    from streamlit.web import cli

    sys.exit(cli.main())
