#ifndef TOKPIPE_VERSION_H
#define TOKPIPE_VERSION_H
#define TP_VERSION "0.1.0"
#endif
