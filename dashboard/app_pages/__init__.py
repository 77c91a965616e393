"""The dashboard's pages, one file per screen, listed in kvscope.dashboard.app."""
