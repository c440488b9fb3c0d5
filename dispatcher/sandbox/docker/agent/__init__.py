"""The agent in a Docker container, from the server's side: started by an attached ``docker exec``
(``attach``), speaking on runc over a unix socket the server listens on (``listener``), otherwise
over the exec's own stream.
"""
