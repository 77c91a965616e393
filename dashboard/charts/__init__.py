"""Pure builders of the dashboard's charts and tables from backend API documents."""
