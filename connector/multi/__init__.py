"""kvscope.connector.multi: a MultiConnector that composes connectors and says who served what."""
