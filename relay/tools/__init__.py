"""Tools around the relay: verification bots (bot.py, `relay bot`) and the user-space link
emulator (netem.py, `relay netem`)."""
